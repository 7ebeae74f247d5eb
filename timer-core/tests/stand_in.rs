//! Relief by lateness (`src/stand_in.rs`): with the default inline executor, whatever
//! holds a driving thread (one task that blocks, many that block at once, many that run
//! just under the bound, a slow tracing subscriber), every other task is started within
//! the bound (20 ms by default) of its deadline, up to the limit of stand-ins; past the
//! limit the rest waits, counted and reported, and nothing is lost. Shutdown still waits
//! for everything that fired, and never for the subscriber.
//!
//! The bounds are asserted at their edge (the bound itself) in a release build, as CI's
//! release step runs this binary (`cargo test --release -p purgatory-timer --test
//! stand_in`); a debug build asserts twice the bound. Its tests take turns, and a scenario
//! past its bound is run again before it fails (`support/on_time.rs` says why).

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use timer_core::{Timer, TimerBuilder, TimerTask};

#[path = "support/on_time.rs"]
mod support;
use support::{in_one_of_three, on_time, one_at_a_time, Ran, Recorded, BOUND};

/// Adds a task due at `deadline` that blocks `blocks`, recording into `ran`.
fn add(timer: &Timer<Recorded>, ran: &Ran, deadline: Duration, blocks: Duration) {
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

/// Waits until `count` tasks ran (10 s at most).
fn wait_for(ran: &Ran, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while ran.lock().unwrap().len() < count && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(ran.lock().unwrap().len(), count, "every task ran");
}

/// The latest lateness, from `start`, of the tasks of `ran` whose deadline is `quick`.
fn latest_quick(
    ran: &[(Duration, Instant)],
    start: Instant,
    quick: impl Fn(Duration) -> bool,
) -> Duration {
    ran.iter()
        .filter(|(deadline, _)| quick(*deadline))
        .map(|(deadline, at)| at.duration_since(start).saturating_sub(*deadline))
        .max()
        .expect("some quick task ran")
}

/// Adds `blocked` tasks blocking `blocks` due at 10 ms, `same` more due in the same tick
/// (behind them in their batch), and `later` more due at 40 ms; waits until all ran;
/// returns the latest lateness of the others.
fn latest_lateness(
    timer: &Timer<Recorded>,
    blocked: usize,
    blocks: Duration,
    same: usize,
    later: usize,
) -> Duration {
    let ran: Ran = Arc::default();
    let start = Instant::now();
    let add = |deadline: Duration, blocks: Duration| add(timer, &ran, deadline, blocks);
    // The slow ones at 10 ms, the others 1 us later: due in the same tick, told apart
    // by their deadline.
    let slow_at = Duration::from_millis(10);
    let same_at = slow_at + Duration::from_micros(1);
    let later_at = Duration::from_millis(40);
    // A bucket hands out its newest task first: the quick ones of the tick go in first,
    // so that the blocked ones are claimed before them (checked below).
    for _ in 0..same {
        add(same_at, Duration::ZERO);
    }
    for _ in 0..blocked {
        add(slow_at, blocks);
    }
    for _ in 0..later {
        add(later_at, Duration::ZERO);
    }
    wait_for(&ran, blocked + same + later);
    let ran = ran.lock().unwrap();
    let first_quick = ran.iter().position(|(deadline, _)| *deadline == same_at);
    let last_blocked = ran.iter().rposition(|(deadline, _)| *deadline == slow_at);
    assert!(
        same == 0 || first_quick > last_blocked,
        "the blocked tasks were claimed first, the quick ones of their tick behind them"
    );
    latest_quick(&ran, start, |deadline| deadline != slow_at)
}

#[test]
fn a_blocked_task_delays_neither_its_batch_nor_later_tasks() {
    let _turn = one_at_a_time();
    in_one_of_three(|| {
        let timer = timer(Some(BOUND));
        let late = latest_lateness(&timer, 1, Duration::from_millis(400), 30, 30);
        on_time("behind a blocked task", late)
    });
}

/// Issue #36: sixteen tasks blocked at once (a broker's worth), and the others due with
/// them and after them still start within the bound: stand-ins take over one held thread
/// after another, two per held thread a look, so a run of sixteen is met in a few looks.
#[test]
fn sixteen_blocked_tasks_delay_no_other() {
    let _turn = one_at_a_time();
    in_one_of_three(|| {
        let timer = timer(Some(BOUND));
        let late = latest_lateness(&timer, 16, Duration::from_millis(500), 30, 30);
        let stats = timer.stats();
        assert!(stats.stand_ins >= 16, "{stats:?}");
        assert_eq!(stats.stand_in_limit_reached, 0, "{stats:?}");
        on_time("behind sixteen blocked tasks", late)
    });
}

/// Issue #36: fifty tasks that each run just under the bound (19 ms), one due every 2 ms,
/// never hold a thread long enough to look stuck for a whole look, and together they
/// would leave the rest nearly a second late on one thread. Relief follows lateness, so
/// the quick tasks due among them (one every millisecond) still start within the bound.
#[test]
fn many_tasks_just_under_the_bound_delay_no_other() {
    let _turn = one_at_a_time();
    let slow = BOUND - Duration::from_millis(1);
    in_one_of_three(|| {
        let timer = timer(Some(BOUND));
        let ran: Ran = Arc::default();
        let start = Instant::now();
        // Slow ones at whole milliseconds, quick ones 1 us after theirs.
        for i in 0..50u64 {
            add(&timer, &ran, Duration::from_millis(10 + 2 * i), slow);
        }
        let quick = 110u64;
        for i in 0..quick {
            let deadline = Duration::from_millis(10 + i) + Duration::from_micros(1);
            add(&timer, &ran, deadline, Duration::ZERO);
        }
        wait_for(&ran, 50 + quick as usize);
        let late = latest_quick(&ran.lock().unwrap(), start, |deadline| {
            deadline.subsec_micros() % 1000 == 1
        });
        on_time(&format!("among tasks of {slow:?} each"), late)
    });
}

/// Without stand-ins the same blocked task delays the rest by its whole length: what the
/// tests above would show if relief did nothing.
#[test]
fn without_a_stand_in_a_blocked_task_delays_the_rest() {
    let _turn = one_at_a_time();
    let timer = timer(None);
    let late = latest_lateness(&timer, 1, Duration::from_millis(300), 5, 5);
    assert!(
        late >= Duration::from_millis(250),
        "ran {late:?} late: the test shows nothing if nothing waits"
    );
}

/// A stand-in that gets stuck too is relieved in turn: three tasks blocking one after
/// the other, each in its own batch, still leave later tasks on time.
#[test]
fn a_stuck_stand_in_is_relieved_in_turn() {
    let _turn = one_at_a_time();
    in_one_of_three(|| {
        let timer = timer(Some(BOUND));
        let ran: Ran = Arc::default();
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
        let late = *quick.iter().max().unwrap();
        on_time("behind three stand-ins stuck in turn", late)
    });
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

/// Every driving thread stuck (more blocked tasks than the stand-ins it may start, here
/// a limit of 7): nothing is lost, the rest waits, the limit is counted, and shutdown,
/// from outside, returns once every task that fired has run.
#[test]
fn every_driving_thread_stuck_loses_nothing_and_shutdown_waits_for_all() {
    let _turn = one_at_a_time();
    let timer: Arc<Timer<Gate>> = Arc::new(
        TimerBuilder::new()
            .stand_in(Some(Duration::from_millis(10)))
            .max_stand_ins(7)
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
    let stats = timer.stats();
    assert_eq!(stats.stand_ins, 7, "{stats:?}");
    assert!(stats.stand_in_limit_reached >= 1, "{stats:?}");
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
    let _turn = one_at_a_time();
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
    let _turn = one_at_a_time();
    let timer: Timer<Recorded> = TimerBuilder::new()
        .thread_name("lv")
        .stand_in(Some(Duration::from_millis(10)))
        .build()
        .unwrap();
    let Some(0) = threads_named("lv-stand-in") else {
        return; // no /proc here
    };
    let ran = Arc::new(Mutex::new(Vec::new()));
    // Quick ones due with it, behind it in its batch (a bucket hands out its newest task
    // first): late behind it.
    for _ in 0..5 {
        add(&timer, &ran, Duration::from_millis(1), Duration::ZERO);
    }
    add(
        &timer,
        &ran,
        Duration::from_millis(1),
        Duration::from_millis(200),
    );
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
