//! The stand-in (`src/stand_in.rs`): with the default inline executor, one task whose code
//! blocks delays no other task by much more than the bound (20 ms): the rest of its batch
//! and the tasks due while it blocks run on time, on a stand-in thread. Shutdown still
//! waits for everything that fired, and a timer whose every driving thread is stuck
//! waits rather than losing anything.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use timer_core::{Timer, TimerBuilder, TimerTask};

/// A task that records when it ran (and its deadline), after blocking for `blocks`.
struct Recorded {
    deadline: Duration,
    blocks: Duration,
    ran: Arc<Mutex<Vec<(Duration, Instant)>>>,
}

impl TimerTask for Recorded {
    fn run(self) {
        self.ran
            .lock()
            .unwrap()
            .push((self.deadline, Instant::now()));
        if !self.blocks.is_zero() {
            std::thread::sleep(self.blocks);
        }
    }
}

/// Adds a task due at `deadline` that blocks `blocks`, recording into `ran`.
fn add(
    timer: &Timer<Recorded>,
    ran: &Arc<Mutex<Vec<(Duration, Instant)>>>,
    deadline: Duration,
    blocks: Duration,
) {
    let ran = Arc::clone(ran);
    let task = Recorded {
        deadline,
        blocks,
        ran,
    };
    timer.add(deadline, task).unwrap();
}

fn timer(stand_in: Option<Duration>) -> Timer<Recorded> {
    TimerBuilder::new().stand_in(stand_in).build().unwrap()
}

/// Adds one task blocking `blocks` due at `slow_at`, `same` more due with it, and `later`
/// more due at `later_at`; waits until all ran; returns the latest lateness of the others.
fn latest_lateness(
    timer: &Timer<Recorded>,
    blocks: Duration,
    same: usize,
    later: usize,
) -> Duration {
    let ran = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let add = |deadline: Duration, blocks: Duration| add(timer, &ran, deadline, blocks);
    let (slow_at, later_at) = (Duration::from_millis(10), Duration::from_millis(40));
    add(slow_at, blocks);
    for _ in 0..same {
        add(slow_at, Duration::ZERO);
    }
    for _ in 0..later {
        add(later_at, Duration::ZERO);
    }
    let total = 1 + same + later;
    let deadline = Instant::now() + Duration::from_secs(10);
    while ran.lock().unwrap().len() < total && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    let ran = ran.lock().unwrap();
    assert_eq!(ran.len(), total, "every task ran");
    ran.iter()
        .skip(1)
        .map(|(deadline, at)| at.duration_since(start).saturating_sub(*deadline))
        .max()
        .unwrap()
}

#[test]
fn a_blocked_task_delays_neither_its_batch_nor_later_tasks() {
    let timer = timer(Some(Duration::from_millis(20)));
    let late = latest_lateness(&timer, Duration::from_millis(400), 30, 30);
    assert!(
        late < Duration::from_millis(150),
        "a task ran {late:?} late behind a blocked one"
    );
}

#[test]
fn without_a_stand_in_a_blocked_task_delays_the_rest() {
    let timer = timer(None);
    let late = latest_lateness(&timer, Duration::from_millis(300), 5, 5);
    assert!(
        late >= Duration::from_millis(250),
        "ran {late:?} late: the test shows nothing if nothing waits"
    );
}

/// A stand-in that gets stuck too is relieved in turn: three tasks blocking one after
/// the other, each in its own batch, still leave later tasks on time.
#[test]
fn a_stuck_stand_in_is_relieved_in_turn() {
    let timer = timer(Some(Duration::from_millis(20)));
    let ran = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let add = |at: u64, blocks: u64| {
        add(
            &timer,
            &ran,
            Duration::from_millis(at),
            Duration::from_millis(blocks),
        )
    };
    for at in [10, 60, 110] {
        add(at, 500);
    }
    for at in (150..300).step_by(10) {
        add(at, 0);
    }
    std::thread::sleep(Duration::from_millis(400));
    let ran = ran.lock().unwrap().clone();
    let quick: Vec<Duration> = ran
        .iter()
        .filter(|(deadline, _)| *deadline >= Duration::from_millis(150))
        .map(|(deadline, at)| at.duration_since(start).saturating_sub(*deadline))
        .collect();
    assert_eq!(quick.len(), 15, "the quick tasks ran while three blocked");
    let late = quick.iter().max().unwrap();
    assert!(*late < Duration::from_millis(150), "{late:?} late");
}

/// A task that counts its run and blocks until released.
struct Gate {
    release: Arc<Mutex<mpsc::Receiver<()>>>,
    started: mpsc::Sender<()>,
    ran: Arc<AtomicUsize>,
}

impl TimerTask for Gate {
    fn run(self) {
        let _ = self.started.send(());
        let _ = self.release.lock().unwrap().recv();
        self.ran.fetch_add(1, SeqCst);
    }
}

/// Every driving thread stuck (more blocked tasks than the stand-ins it may start):
/// nothing is lost, the rest waits, and shutdown, from outside, returns once every task
/// that fired has run.
#[test]
fn every_driving_thread_stuck_loses_nothing_and_shutdown_waits_for_all() {
    let timer: Arc<Timer<Gate>> = Arc::new(
        TimerBuilder::new()
            .stand_in(Some(Duration::from_millis(10)))
            .build()
            .unwrap(),
    );
    let (release_tx, release_rx) = mpsc::channel();
    let release = Arc::new(Mutex::new(release_rx));
    let (started_tx, started) = mpsc::channel();
    let ran = Arc::new(AtomicUsize::new(0));
    let tasks = 12;
    for i in 0..tasks {
        timer
            .add(
                Duration::from_millis(5 + 15 * i as u64),
                Gate {
                    release: Arc::clone(&release),
                    started: started_tx.clone(),
                    ran: Arc::clone(&ran),
                },
            )
            .unwrap();
    }
    // At most 8 driving threads (the reaper and 7 stand-ins) can be stuck at once.
    let mut blocked = 0;
    while started.recv_timeout(Duration::from_millis(500)).is_ok() {
        blocked += 1;
    }
    assert_eq!(blocked, 8, "one blocked task per driving thread, no more");
    let shutdown = {
        let timer = Arc::clone(&timer);
        std::thread::spawn(move || timer.shutdown().len())
    };
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        !shutdown.is_finished(),
        "shutdown waits for the tasks that fired"
    );
    for _ in 0..tasks {
        let _ = release_tx.send(());
    }
    let handed_back = shutdown.join().unwrap();
    assert_eq!(
        ran.load(SeqCst) + handed_back,
        tasks,
        "every task ran or came back"
    );
}
