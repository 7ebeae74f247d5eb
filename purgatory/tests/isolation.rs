//! One operation's user code never delays anyone else's timeout: a `try_complete` that
//! blocks on a thread calling `check_and_complete` while its own timeout comes due must
//! not hold up the expiry of unrelated operations, nor `shutdown`. The busy operation is
//! still completed exactly once, by the thread running its check as soon as its
//! `try_complete` returns: Expired if it said "not ready" (its timeout had passed, so
//! even when that answer comes after shutdown began), Ready if it said "ready" (the
//! check's answer wins: it saw the event first).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, Sender};
use purgatory::{Completion, DelayedOperation, Purgatory, WatchOutcome};

/// An operation whose `try_complete` blocks, when `gated`, until the test releases it
/// with a verdict; it records how it completed.
struct Gated {
    timeout: Duration,
    gated: Arc<AtomicBool>,
    entered: Sender<()>,
    verdict: Receiver<bool>,
    completions: Arc<Mutex<Vec<Completion>>>,
}

impl DelayedOperation for Gated {
    fn timeout(&self) -> Duration {
        self.timeout
    }
    fn try_complete(&mut self) -> bool {
        if !self.gated.load(SeqCst) {
            return false;
        }
        let _ = self.entered.send(());
        self.verdict
            .recv_timeout(Duration::from_secs(20))
            .expect("the test releases the gate")
    }
    fn on_complete(&mut self, how: Completion) {
        self.completions.lock().unwrap().push(how);
    }
}

/// A plain operation on its own key that records when it expired.
struct Bystander {
    expired_at: Arc<Mutex<Vec<Instant>>>,
    count: Arc<AtomicUsize>,
}

impl DelayedOperation for Bystander {
    fn timeout(&self) -> Duration {
        Duration::from_millis(150)
    }
    fn try_complete(&mut self) -> bool {
        false
    }
    fn on_complete(&mut self, how: Completion) {
        assert_eq!(how, Completion::Expired);
        self.expired_at.lock().unwrap().push(Instant::now());
        self.count.fetch_add(1, SeqCst);
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Key {
    Busy,
    Other(u32),
}

enum Op {
    Gated(Gated),
    Bystander(Bystander),
}

impl DelayedOperation for Op {
    fn timeout(&self) -> Duration {
        match self {
            Op::Gated(op) => op.timeout(),
            Op::Bystander(op) => op.timeout(),
        }
    }
    fn try_complete(&mut self) -> bool {
        match self {
            Op::Gated(op) => op.try_complete(),
            Op::Bystander(op) => op.try_complete(),
        }
    }
    fn on_complete(&mut self, how: Completion) {
        match self {
            Op::Gated(op) => op.on_complete(how),
            Op::Bystander(op) => op.on_complete(how),
        }
    }
}

/// Runs the scenario; `ready` is the busy `try_complete`'s verdict once released.
/// Returns how the busy operation completed.
fn a_blocked_check_while_its_timeout_passes(ready: bool) -> Vec<Completion> {
    let purgatory: Purgatory<Key, Op> = Purgatory::new("isolation");
    let gated = Arc::new(AtomicBool::new(false));
    let (entered_tx, entered) = bounded(1);
    let (release, verdict) = bounded(1);
    let completions = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let busy = Gated {
        timeout: Duration::from_millis(100),
        gated: Arc::clone(&gated),
        entered: entered_tx,
        verdict,
        completions: Arc::clone(&completions),
    };
    assert!(!purgatory
        .try_complete_else_watch(Op::Gated(busy), [Key::Busy])
        .unwrap());
    let expired_at = Arc::new(Mutex::new(Vec::new()));
    let count = Arc::new(AtomicUsize::new(0));
    for n in 0..100 {
        let op = Bystander {
            expired_at: Arc::clone(&expired_at),
            count: Arc::clone(&count),
        };
        assert!(!purgatory
            .try_complete_else_watch(Op::Bystander(op), [Key::Other(n)])
            .unwrap());
    }
    // A request thread checks the busy key; its `try_complete` blocks.
    gated.store(true, SeqCst);
    let checker = {
        let purgatory = purgatory.clone();
        std::thread::spawn(move || purgatory.check_and_complete(&Key::Busy))
    };
    entered
        .recv_timeout(Duration::from_secs(10))
        .expect("the check reached try_complete");
    // Everyone else expires on time while it blocks (due at 150 ms).
    let deadline = Instant::now() + Duration::from_secs(10);
    while count.load(SeqCst) < 100 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let latest = expired_at.lock().unwrap().iter().max().copied();
    let lateness = latest.map(|t| t.duration_since(start));
    assert_eq!(count.load(SeqCst), 100, "bystanders expired: {lateness:?}");
    assert!(
        lateness.unwrap() < Duration::from_millis(1_000),
        "the last bystander expired {lateness:?} after the start, behind a blocked try_complete"
    );
    // Shutdown does not wait for the blocked user code either.
    let before = Instant::now();
    purgatory.shutdown();
    assert!(
        before.elapsed() < Duration::from_millis(1_000),
        "shutdown took {:?} behind a blocked try_complete",
        before.elapsed()
    );
    assert!(
        completions.lock().unwrap().is_empty(),
        "the busy operation waits for its try_complete to return"
    );
    // Released: the checking thread completes it, once.
    release.send(ready).unwrap();
    let completed = checker.join().unwrap();
    assert_eq!(completed, usize::from(ready));
    let how = completions.lock().unwrap().clone();
    how
}

#[test]
fn a_blocked_not_ready_check_delays_no_other_expiry_and_its_operation_then_expires() {
    assert_eq!(
        a_blocked_check_while_its_timeout_passes(false),
        // Answered when the check returns, after the shutdown in between: still the
        // timeout's, which came first.
        [Completion::Expired]
    );
}

#[test]
fn a_blocked_check_that_says_ready_completes_its_operation_once_as_ready() {
    assert_eq!(
        a_blocked_check_while_its_timeout_passes(true),
        [Completion::Ready]
    );
}

/// A key whose `Hash` and `Drop` can be made slow, to show what runs under a shard lock.
#[derive(Clone, Debug)]
struct SlowKey {
    id: u32,
    slow_hash: Arc<AtomicBool>,
    slow_drop: Arc<AtomicBool>,
}

const SLOW: Duration = Duration::from_millis(300);

impl std::hash::Hash for SlowKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        if self.slow_hash.load(SeqCst) {
            std::thread::sleep(SLOW);
        }
        self.id.hash(state);
    }
}

impl PartialEq for SlowKey {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for SlowKey {}

impl Drop for SlowKey {
    fn drop(&mut self) {
        if self.slow_drop.load(SeqCst) {
            std::thread::sleep(SLOW);
        }
    }
}

/// Never ready; waits a minute.
struct Idle;

impl DelayedOperation for Idle {
    fn timeout(&self) -> Duration {
        Duration::from_secs(60)
    }
    fn try_complete(&mut self) -> bool {
        false
    }
    fn on_complete(&mut self, _how: Completion) {}
}

/// Runs `slow` on one thread and, once it has started, times a check of an unrelated key
/// of the same (only) shard on this one.
fn a_check_beside(
    slow: impl FnOnce(&Purgatory<SlowKey, Idle>, &SlowKey) + Send + 'static,
    setup: impl Fn(&SlowKey),
) -> Duration {
    let purgatory: Purgatory<SlowKey, Idle> = purgatory::PurgatoryBuilder::new()
        .name("slow-keys")
        .shards(1)
        .build()
        .unwrap();
    let key = |id| SlowKey {
        id,
        slow_hash: Arc::new(AtomicBool::new(false)),
        slow_drop: Arc::new(AtomicBool::new(false)),
    };
    let (hostile, other) = (key(1), key(2));
    assert!(!purgatory
        .try_complete_else_watch(Idle, [hostile.clone()])
        .unwrap());
    assert!(!purgatory
        .try_complete_else_watch(Idle, [other.clone()])
        .unwrap());
    setup(&hostile);
    let runner = {
        let purgatory = purgatory.clone();
        let hostile = hostile.clone();
        std::thread::spawn(move || slow(&purgatory, &hostile))
    };
    std::thread::sleep(Duration::from_millis(50)); // the slow call is under way
    let start = Instant::now();
    assert_eq!(purgatory.check_and_complete(&other), 0);
    let waited = start.elapsed();
    runner.join().unwrap();
    hostile.slow_hash.store(false, SeqCst);
    hostile.slow_drop.store(false, SeqCst);
    waited
}

#[test]
fn a_slow_hash_never_holds_a_shard_lock() {
    let waited = a_check_beside(
        |purgatory, hostile| {
            purgatory.check_and_complete(hostile);
        },
        |hostile| hostile.slow_hash.store(true, SeqCst),
    );
    assert!(
        waited < Duration::from_millis(150),
        "a check waited {waited:?} behind a slow Hash"
    );
}

#[test]
fn a_slow_key_drop_never_holds_a_shard_lock() {
    // Cancelling by key removes the list, and with it the stored key: its drop is slow.
    let waited = a_check_beside(
        |purgatory, hostile| {
            let probe = SlowKey {
                id: hostile.id,
                slow_hash: Arc::new(AtomicBool::new(false)),
                slow_drop: Arc::new(AtomicBool::new(false)),
            };
            assert_eq!(purgatory.cancel_for_key(&probe).len(), 1);
        },
        |hostile| hostile.slow_drop.store(true, SeqCst),
    );
    assert!(
        waited < Duration::from_millis(150),
        "a check waited {waited:?} behind a slow key drop"
    );
}

/// An operation whose `try_complete` takes `busy` once `slow` is set, and that records
/// when and how it was answered.
struct Timed {
    timeout: Duration,
    busy: Duration,
    slow: Arc<AtomicBool>,
    answered: Arc<Mutex<Vec<(Instant, Completion)>>>,
}

impl DelayedOperation for Timed {
    fn timeout(&self) -> Duration {
        self.timeout
    }
    fn try_complete(&mut self) -> bool {
        if self.slow.load(SeqCst) {
            std::thread::sleep(self.busy);
        }
        false
    }
    fn on_complete(&mut self, how: Completion) {
        self.answered.lock().unwrap().push((Instant::now(), how));
    }
}

/// Issue #27, finding 3: key 1 lists B (50 ms timeout, its `try_complete` takes 80 ms)
/// and then A (its `try_complete` takes 1.5 s). B's timeout fires while the check holds
/// B: the expiry is handed to the checking thread, which must answer it as soon as B's
/// `try_complete` returns, not after A's. And a `shutdown` called while A's
/// `try_complete` runs returns only once B is answered.
#[test]
fn an_expiry_handed_to_a_check_is_answered_before_the_next_candidate_is_tried() {
    let purgatory: Purgatory<u32, Timed> = Purgatory::new("handed-over");
    let slow = Arc::new(AtomicBool::new(false));
    let (b_answered, a_answered) = (
        Arc::new(Mutex::new(Vec::new())),
        Arc::new(Mutex::new(Vec::new())),
    );
    let op = |timeout, busy, answered: &Arc<Mutex<Vec<_>>>| Timed {
        timeout,
        busy,
        slow: Arc::clone(&slow),
        answered: Arc::clone(answered),
    };
    let started = Instant::now();
    assert!(!purgatory
        .try_complete_else_watch(
            op(
                Duration::from_millis(50),
                Duration::from_millis(80),
                &b_answered
            ),
            [1]
        )
        .unwrap());
    assert!(!purgatory
        .try_complete_else_watch(
            op(
                Duration::from_secs(60),
                Duration::from_millis(1_500),
                &a_answered
            ),
            [1]
        )
        .unwrap());
    slow.store(true, SeqCst);
    let checker = {
        let purgatory = purgatory.clone();
        std::thread::spawn(move || purgatory.check_and_complete(&1))
    };
    // While A's try_complete runs (from about 80 ms to 1.58 s): shut down.
    std::thread::sleep(Duration::from_millis(400));
    purgatory.shutdown();
    let b = b_answered.lock().unwrap().clone();
    assert_eq!(
        b.iter().map(|(_, how)| *how).collect::<Vec<_>>(),
        [Completion::Expired],
        "B answered by the time shutdown returned"
    );
    let at = b[0].0.duration_since(started);
    assert!(
        at < Duration::from_millis(400),
        "B was answered {at:?} after the start, behind A's try_complete"
    );
    assert_eq!(checker.join().unwrap(), 0);
    let a = a_answered.lock().unwrap().clone();
    assert_eq!(
        a.iter().map(|(_, how)| *how).collect::<Vec<_>>(),
        // Its 60 s timer was drained by the shutdown while its check held it: shutdown's
        // answer, given as the check let go.
        [Completion::Shutdown]
    );
}

/// Issue #27, finding 6: one slow `try_complete` in a `watch_batch` must not hold up the
/// timeouts of the batch's other operations: 40 operations with 50 ms timeouts are
/// answered on time while the batch call is still busy in the slow one.
#[test]
fn one_slow_try_complete_in_a_batch_delays_no_other_timeout_of_the_batch() {
    let purgatory: Purgatory<u32, Timed> = Purgatory::new("slow-batch");
    let (fast, slow) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(true)),
    );
    let answered = Arc::new(Mutex::new(Vec::new()));
    let started = Instant::now();
    let batch = (0..41u32).map(|i| {
        let op = Timed {
            timeout: Duration::from_millis(50),
            busy: Duration::from_millis(1_500),
            // The 21st operation is the slow one.
            slow: Arc::clone(if i == 20 { &slow } else { &fast }),
            answered: Arc::clone(&answered),
        };
        (op, [i])
    });
    let results = purgatory.watch_batch(batch);
    let returned = started.elapsed();
    assert!(results.iter().all(Result::is_ok));
    assert!(returned >= Duration::from_millis(1_500), "the slow try ran");
    let answered = answered.lock().unwrap().clone();
    let on_time = answered
        .iter()
        .filter(|(at, how)| {
            *how == Completion::Expired && at.duration_since(started) < Duration::from_millis(700)
        })
        .count();
    // The slow one itself is held by its own try_complete, and both its tries are slow.
    assert!(
        on_time >= 40,
        "{on_time} of 40 answered within 700 ms; latest answered {:?} after the call",
        answered
            .iter()
            .map(|(at, _)| at.duration_since(started))
            .max()
    );
    purgatory.shutdown();
}

/// An operation whose `on_complete` blocks for `blocks` when it expires, and that records
/// when it was answered, with its deadline.
struct SlowAnswer {
    timeout: Duration,
    blocks: Duration,
    answered: Arc<Mutex<Vec<(Duration, Instant)>>>,
}

impl DelayedOperation for SlowAnswer {
    fn timeout(&self) -> Duration {
        self.timeout
    }
    fn try_complete(&mut self) -> bool {
        false
    }
    fn on_complete(&mut self, _how: Completion) {
        self.answered
            .lock()
            .unwrap()
            .push((self.timeout, Instant::now()));
        if !self.blocks.is_zero() {
            std::thread::sleep(self.blocks);
        }
    }
}

/// Issue #27, finding 8: with the default configuration (expirations inline on the
/// reaper), one expiry callback that blocks 300 ms delays no other timeout by much: the
/// operations expiring in the same tick as it, and those due while it blocks, are
/// answered within about the stand-in's bound (20 ms) of their deadline, not after it.
#[test]
fn a_blocked_expiry_callback_delays_no_other_timeout_by_default() {
    let purgatory: Purgatory<u32, SlowAnswer> = Purgatory::new("isolated-by-default");
    let answered = Arc::new(Mutex::new(Vec::new()));
    let started = Instant::now();
    let op = |timeout: u64, blocks: u64| SlowAnswer {
        timeout: Duration::from_millis(timeout),
        blocks: Duration::from_millis(blocks),
        answered: Arc::clone(&answered),
    };
    // The slow one, then 20 more due in the same tick, then 20 due while it blocks.
    let mut batch = vec![(op(10, 300), [0])];
    batch.extend((1..21).map(|k| (op(10, 0), [k])));
    batch.extend((21..41).map(|k| (op(40, 0), [k])));
    for result in purgatory.watch_batch(batch) {
        assert!(result.is_ok());
    }
    assert!(probe_until(Duration::from_secs(5), || answered
        .lock()
        .unwrap()
        .len()
        == 41));
    let answered = answered.lock().unwrap().clone();
    let latest = answered
        .iter()
        .skip(1)
        .map(|(deadline, at)| at.duration_since(started).saturating_sub(*deadline))
        .max()
        .unwrap();
    assert!(
        latest < Duration::from_millis(150),
        "an operation was answered {latest:?} after its deadline, behind a blocked callback"
    );
    purgatory.shutdown();
}

/// Polls `done` every millisecond until it holds or `limit` passes.
fn probe_until(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while !done() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    true
}

/// A key whose one armed copy's `Drop` blocks for a second.
struct SlowDropKey {
    id: u32,
    slow: Option<Arc<AtomicBool>>,
}

impl Clone for SlowDropKey {
    fn clone(&self) -> Self {
        SlowDropKey {
            id: self.id,
            slow: None,
        }
    }
}

impl std::hash::Hash for SlowDropKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.id.hash(state);
    }
}

impl PartialEq for SlowDropKey {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for SlowDropKey {}

impl Drop for SlowDropKey {
    fn drop(&mut self) {
        if self.slow.as_ref().is_some_and(|slow| slow.load(SeqCst)) {
            std::thread::sleep(Duration::from_secs(1));
        }
    }
}

/// A key whose `Drop` blocks while the reaper's purge drops its emptied list (user code in
/// a round's hook, not in a callback) delays no timeout either: a stand-in runs the rounds
/// meanwhile.
#[test]
fn a_key_drop_blocking_in_the_reapers_purge_delays_no_timeout() {
    let purgatory: Purgatory<SlowDropKey, SlowAnswer> = purgatory::PurgatoryBuilder::new()
        .name("slow-key-purge")
        .purge_interval(1)
        .build()
        .unwrap();
    let slow = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(Mutex::new(Vec::new()));
    let op = |timeout: u64| SlowAnswer {
        timeout: Duration::from_millis(timeout),
        blocks: Duration::ZERO,
        answered: Arc::clone(&answered),
    };
    // Twenty operations, one of them on the slow key, completed: their entries are
    // stale, and with the ten below a purge is due (stale at least the interval and half
    // of what is listed); the reaper's next purge drops the slow key.
    let mut completed = Vec::new();
    for id in 100..120 {
        let slow = (id == 100).then(|| Arc::clone(&slow));
        let WatchOutcome::Pending(handle) = purgatory
            .watch(op(60_000), [SlowDropKey { id, slow }])
            .unwrap()
        else {
            panic!("never ready");
        };
        completed.push(handle);
    }
    slow.store(true, SeqCst);
    assert_eq!(purgatory.force_complete_batch(&completed), 20);
    let started = Instant::now();
    for id in 2..12 {
        let other = SlowDropKey { id, slow: None };
        assert!(!purgatory.try_complete_else_watch(op(50), [other]).unwrap());
    }
    assert!(probe_until(Duration::from_secs(5), || answered
        .lock()
        .unwrap()
        .len()
        == 30));
    assert!(
        probe_until(Duration::from_secs(5), || purgatory.stats().purged > 0),
        "the purge ran"
    );
    let latest = answered
        .lock()
        .unwrap()
        .iter()
        .filter(|(deadline, _)| *deadline == Duration::from_millis(50))
        .map(|(_, at)| at.duration_since(started))
        .max()
        .unwrap();
    assert!(
        latest < Duration::from_millis(250),
        "a 50 ms timeout answered after {latest:?}, behind a key's Drop in a purge"
    );
    slow.store(false, SeqCst);
    purgatory.shutdown();
}
