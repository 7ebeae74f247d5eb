//! Relief by lateness at its edges (`src/stand_in.rs`), each found by a hostile review of
//! the change (issue #36): a clock of the user's own, the target's last reference, a limit
//! of one, a batch that computes rather than waits, an owner's target that panics after
//! its last claim, a bound too small to watch, and the watchdog's looks at the limit.
//!
//! CI runs this binary in a release build too (`cargo test --release -p purgatory-timer
//! --test relief_edges`), where lateness is asserted at the bound (twice it in a debug
//! build). Its tests take turns: several measure lateness or count threads on a 2-core
//! machine; a scenario past its bound is run again before it fails
//! (`support/on_time.rs`).

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use timer_core::{BuildError, Clock, Driver, Expire, Timer, TimerBuilder, TimerCore, TimerTask};

#[path = "support/on_time.rs"]
mod support;
use support::{in_one_of_three, on_time, one_at_a_time};

/// What ran: each task's deadline and when it started.
type Ran = Arc<Mutex<Vec<(Duration, Instant)>>>;

/// Records when it ran, then blocks for `blocks` or computes for `spins`.
struct Rec {
    deadline: Duration,
    blocks: Duration,
    spins: Duration,
    ran: Ran,
}

impl TimerTask for Rec {
    fn run(self) {
        self.ran
            .lock()
            .unwrap()
            .push((self.deadline, Instant::now()));
        std::thread::sleep(self.blocks);
        let until = Instant::now() + self.spins;
        while Instant::now() < until {
            std::hint::spin_loop();
        }
    }
}

fn add(timer: &Timer<Rec>, ran: &Ran, deadline: Duration, blocks: Duration) {
    let task = Rec {
        deadline,
        blocks,
        spins: Duration::ZERO,
        ran: Arc::clone(ran),
    };
    timer.add(deadline, task).unwrap();
}

fn wait_for(ran: &Ran, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while ran.lock().unwrap().len() < count && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(ran.lock().unwrap().len(), count, "every task ran");
}

/// The lateness of the task due at `deadline`, from `start`.
fn lateness(ran: &Ran, start: Instant, deadline: Duration) -> Duration {
    ran.lock()
        .unwrap()
        .iter()
        .filter(|(at, _)| *at == deadline)
        .map(|(at, when)| when.duration_since(start).saturating_sub(*at))
        .max()
        .expect("it ran")
}

/// A clock of the user's own: `Instant` since its construction.
struct InstantClock(Instant);

impl Clock for InstantClock {
    fn now(&self) -> Duration {
        self.0.elapsed()
    }
}

/// With a clock of the user's own, the watchdog (which never reads it: user code) knows
/// the time from the timer's last reading of it plus the real time since. Before, it had
/// the last reading alone: with the reaper held and nothing added, nothing moved it, and
/// a task due 20 ms after a blocked one waited for it (381 ms late).
#[test]
fn a_clock_of_the_users_own_gets_relief_too() {
    let _turn = one_at_a_time();
    in_one_of_three(|| {
        let timer: Timer<Rec> = TimerBuilder::new()
            .clock(InstantClock(Instant::now()))
            .build()
            .unwrap();
        let ran: Ran = Arc::default();
        let start = Instant::now();
        // Alone in its batch (nothing left to claim behind it), it blocks 400 ms.
        add(
            &timer,
            &ran,
            Duration::from_millis(10),
            Duration::from_millis(400),
        );
        add(&timer, &ran, Duration::from_millis(30), Duration::ZERO);
        wait_for(&ran, 2);
        let late = lateness(&ran, start, Duration::from_millis(30));
        on_time("with a clock of the user's own", late)
    });
}

/// Where each target of `the_watchdog_never_drops_the_target` was dropped.
static DROPPED_ON: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// The driver of `the_watchdog_never_drops_the_target`, for its task to drop.
static DRIVER: Mutex<Option<Driver<Target>>> = Mutex::new(None);

/// An owner's target whose task 1 drops the driver's last handle, inside its expiry.
struct Target {
    core: TimerCore<u32>,
}

impl Expire for Target {
    type Task = u32;
    fn core(&self) -> &TimerCore<u32> {
        &self.core
    }
    fn expire(&self, expired: &mut Vec<u32>) {
        for task in expired.drain(..) {
            self.expire_one(task);
        }
    }
    fn expire_one(&self, task: u32) {
        if task == 1 {
            drop(DRIVER.lock().unwrap().take());
        }
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let name = std::thread::current().name().unwrap_or("?").to_owned();
        DROPPED_ON.lock().unwrap().push(name);
    }
}

/// A driver dropped from inside its own expiry work is not joined: its watchdog may let
/// go of the shared state last, which drops the owner's target (user code: the
/// purgatory's state releases recorder handles, drops keys). The watchdog runs no user
/// code: that drop goes to a thread of its own. Before, 52-91 % of 200 drops ran on the
/// watchdog.
#[test]
fn the_watchdog_never_drops_the_target() {
    let _turn = one_at_a_time();
    let runs = 100;
    for _ in 0..runs {
        let (core, config) = TimerBuilder::new().build_parts::<u32>().unwrap();
        let driver = config.start(Target { core }, "wd").unwrap();
        driver
            .target()
            .core()
            .add(Duration::from_millis(1), 0)
            .unwrap();
        driver
            .target()
            .core()
            .add(Duration::from_millis(3), 1)
            .unwrap();
        *DRIVER.lock().unwrap() = Some(driver);
        let before = DROPPED_ON.lock().unwrap().len();
        let deadline = Instant::now() + Duration::from_secs(5);
        while DROPPED_ON.lock().unwrap().len() == before && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let on = DROPPED_ON.lock().unwrap().clone();
    assert_eq!(on.len(), runs, "every target dropped: {on:?}");
    let on_watchdog = on.iter().filter(|name| name.ends_with("-watchdog")).count();
    assert_eq!(on_watchdog, 0, "dropped on the watchdog: {on:?}");
}

/// One callback held with a limit of one stand-in is within the promise: the limit is
/// not "reached" (the watchdog wants a spare, which it does without). Before, it was
/// counted and warned in 5 of 5 runs.
#[test]
fn one_held_within_a_limit_of_one_reaches_no_limit() {
    let _turn = one_at_a_time();
    in_one_of_three(|| {
        let timer: Timer<Rec> = TimerBuilder::new().max_stand_ins(1).build().unwrap();
        let ran: Ran = Arc::default();
        let start = Instant::now();
        let at = Duration::from_millis(10);
        let behind = at + Duration::from_micros(1);
        for _ in 0..20 {
            add(&timer, &ran, behind, Duration::ZERO);
        }
        add(&timer, &ran, at, Duration::from_millis(300));
        wait_for(&ran, 21);
        let late = lateness(&ran, start, behind);
        let stats = timer.stats();
        assert_eq!(stats.stand_in_limit_reached, 0, "{stats:?}");
        on_time("behind one held with one stand-in", late)
    });
}

/// A batch of 100,000 tasks that compute 10 us each holds no thread: threads that take
/// turns on two cores make no claim for a look while the batch moves. Relief gives it a
/// few threads (fewer than twice the cores move at once), and never "reaches the limit".
/// Before, 32 threads and the limit's warning, in every run. The limit is never reached;
/// the count of stand-ins started is judged in one of three runs, as the lateness bounds
/// are: with other work on the cores (a Miri run beside it) the batch stays late longer,
/// and one run of seven counted 34.
#[test]
fn a_batch_that_computes_reaches_no_limit() {
    let _turn = one_at_a_time();
    in_one_of_three(|| {
        let timer: Timer<Rec> = TimerBuilder::new().build().unwrap();
        let ran: Ran = Arc::default();
        let at = Duration::from_millis(20);
        let tasks = 100_000;
        for _ in 0..tasks {
            let task = Rec {
                deadline: at,
                blocks: Duration::ZERO,
                spins: Duration::from_micros(10),
                ran: Arc::clone(&ran),
            };
            timer.add(at, task).unwrap();
        }
        wait_for(&ran, tasks);
        let stats = timer.stats();
        assert_eq!(stats.stand_in_limit_reached, 0, "{stats:?}");
        let report = format!("{} stand-ins started", stats.stand_ins);
        if stats.stand_ins < 32 {
            Ok(report)
        } else {
            Err(report)
        }
    });
}

/// `expire_claimed` calls of the target below.
static CLAIMED_CALLS: AtomicUsize = AtomicUsize::new(0);

/// An owner's target whose `expire_claimed` panics after its last claim (a flush at the
/// end of a batch that fails).
struct PanicsAfterItsClaims {
    core: TimerCore<u32>,
}

impl Expire for PanicsAfterItsClaims {
    type Task = u32;
    fn core(&self) -> &TimerCore<u32> {
        &self.core
    }
    fn expire(&self, expired: &mut Vec<u32>) {
        expired.clear();
    }
    fn expire_claimed(&self, mut claim: impl FnMut() -> Option<u32>) {
        CLAIMED_CALLS.fetch_add(1, SeqCst);
        while claim().is_some() {}
        panic!("a flush at the end of the batch (on purpose)");
    }
}

/// A target that panics after its last claim is called once per batch by each thread on
/// it: the driver calls it again after a panic only while tasks are left. Before, it was called again without
/// end, a spinning driving thread per batch (109,301 calls in 0.5 s).
#[test]
fn a_target_that_panics_after_its_last_claim_is_not_called_again() {
    let _turn = one_at_a_time();
    let (core, config) = TimerBuilder::new().build_parts::<u32>().unwrap();
    let driver = config
        .start(PanicsAfterItsClaims { core }, "claims")
        .unwrap();
    for i in 0..5u32 {
        let delay = Duration::from_millis(10 + 30 * u64::from(i));
        driver.target().core().add(delay, i).unwrap();
    }
    std::thread::sleep(Duration::from_millis(400));
    let calls = CLAIMED_CALLS.load(SeqCst);
    drop(driver);
    // Once a batch by its thread, and once more by each stand-in that joined it while
    // the panic's report ran (a backtrace under `RUST_BACKTRACE=1` takes milliseconds).
    assert!((5..=15).contains(&calls), "{calls} calls for 5 batches");
}

/// A bound under a millisecond is refused: the watchdog would look thousands of times a
/// second (a bound of zero: 2,773-3,711 looks a second and 220 stand-ins a second under
/// a load of short callbacks).
#[test]
fn a_bound_under_a_millisecond_is_refused() {
    for bound in [Duration::ZERO, Duration::from_micros(999)] {
        let built = TimerBuilder::new().stand_in(Some(bound)).build::<Rec>();
        assert!(
            matches!(built, Err(BuildError::InvalidStandInBound(b)) if b == bound),
            "{bound:?} accepted"
        );
    }
    assert!(TimerBuilder::new()
        .stand_in(Some(Duration::from_millis(1)))
        .build::<Rec>()
        .is_ok());
}

/// Context switches of this process's thread named `name` (Linux: `/proc`), or `None`.
fn switches_of(name: &str) -> Option<u64> {
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let path = task.ok()?.path();
        let comm = std::fs::read_to_string(path.join("comm")).ok()?;
        if comm.trim_end() != name {
            continue;
        }
        let status = std::fs::read_to_string(path.join("status")).ok()?;
        return Some(
            status
                .lines()
                .filter(|line| line.contains("ctxt_switches"))
                .filter_map(|line| line.split_whitespace().nth(1)?.parse::<u64>().ok())
                .sum(),
        );
    }
    None
}

/// At the limit no look can start anything, so the watchdog looks every half bound
/// (100 times a second), not every twentieth (1,000): before, 692-882 wake-ups a second
/// for as long as the callbacks were held.
#[test]
fn at_the_limit_the_watchdog_looks_every_half_bound() {
    let _turn = one_at_a_time();
    let timer: Timer<Rec> = TimerBuilder::new()
        .thread_name("lim")
        .max_stand_ins(4)
        .build()
        .unwrap();
    let ran: Ran = Arc::default();
    for _ in 0..10 {
        add(
            &timer,
            &ran,
            Duration::from_millis(1),
            Duration::from_secs(2),
        );
    }
    std::thread::sleep(Duration::from_millis(300));
    let Some(before) = switches_of("lim-watchdog") else {
        return; // no /proc here
    };
    std::thread::sleep(Duration::from_secs(1));
    let after = switches_of("lim-watchdog").expect("the watchdog still runs");
    let stats = timer.stats();
    assert!(stats.stand_in_limit_reached >= 1, "{stats:?}");
    assert!(
        after - before < 250,
        "the watchdog woke {} times in a second at the limit",
        after - before
    );
}
