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

/// A task whose `Drop` panics, for an owner's target whose `expire` panics before it
/// takes its batch.
struct Bomb(Arc<AtomicUsize>);

impl Drop for Bomb {
    fn drop(&mut self) {
        self.0.fetch_add(1, SeqCst);
        // Also while unwinding: where the library drops a task then, this aborts.
        panic!("a task's Drop (on purpose)");
    }
}

/// An owner's target without `expire_one` (the default hands `expire` a batch of one),
/// whose `expire` panics with the task still in the batch.
struct PanickingTarget {
    core: timer_core::TimerCore<Bomb>,
}

impl timer_core::Expire for PanickingTarget {
    type Task = Bomb;

    fn core(&self) -> &timer_core::TimerCore<Bomb> {
        &self.core
    }

    fn expire(&self, _expired: &mut Vec<Bomb>) {
        panic!("an owner's expire (on purpose)");
    }
}

/// On a reaper with stand-ins, the default `expire_one` drops the task its panicking
/// `expire` left behind through the driver's catch, on its own: the task's `Drop`
/// panicking too is caught. Before, the task was dropped while the first panic unwound,
/// and the second panic aborted the process.
#[test]
fn the_default_expire_one_drops_what_a_panicking_expire_left_through_the_door() {
    let (core, config) = TimerBuilder::new().build_parts::<Bomb>().unwrap();
    let driver = config
        .start(PanickingTarget { core }, "expire-one-default")
        .unwrap();
    let dropped = Arc::new(AtomicUsize::new(0));
    for delay in [1, 1, 5] {
        driver
            .target()
            .core
            .add(Duration::from_millis(delay), Bomb(Arc::clone(&dropped)))
            .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while dropped.load(SeqCst) < 3 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        dropped.load(SeqCst),
        3,
        "every task dropped once, the reaper alive"
    );
    drop(driver);
}

/// Threads of this process named `name` (Linux: `/proc/self/task/*/comm`, names cut at 15
/// bytes); `None` where that cannot be read.
fn threads_named(name: &str) -> Option<usize> {
    let tasks = std::fs::read_dir("/proc/self/task").ok()?;
    Some(
        tasks
            .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
            .filter(|comm| comm.trim_end() == name)
            .count(),
    )
}

/// A stand-in leaves soon after the batch it relieved ends, even when the next deadline
/// is far away. Before, it slept in its round until that deadline (or an earlier add),
/// holding its slot.
#[test]
fn a_stand_in_leaves_soon_after_the_stuck_batch_ends() {
    let timer: Timer<Recorded> = TimerBuilder::new()
        .thread_name("lv")
        .stand_in(Some(Duration::from_millis(10)))
        .build()
        .unwrap();
    let Some(0) = threads_named("lv-stand-in") else {
        return; // no /proc here
    };
    let ran = Arc::new(Mutex::new(Vec::new()));
    add(
        &timer,
        &ran,
        Duration::from_millis(1),
        Duration::from_millis(200),
    );
    add(&timer, &ran, Duration::from_millis(1), Duration::ZERO);
    add(&timer, &ran, Duration::from_secs(600), Duration::ZERO);
    let started = Instant::now();
    let mut seen = 0;
    while started.elapsed() < Duration::from_millis(150) {
        seen = seen.max(threads_named("lv-stand-in").unwrap());
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(seen >= 1, "a stand-in relieved the blocked task's batch");
    let deadline = Instant::now() + Duration::from_secs(5);
    while threads_named("lv-stand-in").unwrap() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        threads_named("lv-stand-in").unwrap(),
        0,
        "a stand-in stayed after the blocked task returned"
    );
    drop(timer);
}
