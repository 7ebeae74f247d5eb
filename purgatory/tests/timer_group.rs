//! Purgatories on one timer (`TimerGroup`, issue #37): one test per row of the table in
//! `docs/purgatory.md` ("Several purgatories on one timer"): what the members share (the
//! timer, its threads and their relief, shutdown) and what each keeps (its operations,
//! figures and name); how a group is built, refused, shut down and dropped. The
//! randomized ledger (`tests/ledger.rs`) runs every third epoch on a group beside a busy
//! neighbour.

mod probe;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use probe::{never, wait_until, Ledger, Probe};
use purgatory::{
    BuildError, Completion, DelayedOperation, ManualClock, Purgatory, PurgatoryBuilder,
    TimerBuilder, TimerGroup, WatchError,
};

const LONG: Duration = Duration::from_secs(200);

fn manual_group(clock: &ManualClock) -> TimerGroup {
    TimerGroup::builder()
        .name("manual-group")
        .timer(TimerBuilder::new().clock(clock.clone()).reaper(false))
        .build()
        .unwrap()
}

/// Asserts that a watch left its operation waiting.
fn waits<O>(watched: Result<purgatory::WatchOutcome<O>, WatchError<O>>) {
    assert!(matches!(watched, Ok(purgatory::WatchOutcome::Pending(_))));
}

/// The names of this process's threads that start with `prefix`.
fn threads_named(prefix: &str) -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .map(|name| name.trim().to_owned())
        .filter(|name| name.starts_with(prefix))
        .collect()
}

/// Row "the timer and its threads": purgatories of different key and operation types on
/// one group run one reaper between them, and each expires its own operations on time.
#[test]
fn members_of_different_types_share_one_reaper() {
    let group = TimerGroup::new("grp-one");
    let ledger = Ledger::new(6);
    let no = never();
    let produce: Purgatory<u64, Probe> = PurgatoryBuilder::new()
        .name("grp-one-produce")
        .build_on(&group)
        .unwrap();
    let fetch: Purgatory<String, Probe> = PurgatoryBuilder::new()
        .name("grp-one-fetch")
        .build_on(&group)
        .unwrap();
    for id in 0..3 {
        let op = Probe::new(id, Duration::from_millis(30), &ledger, &no);
        assert!(!produce.try_complete_else_watch(op, [id as u64]).unwrap());
        let op = Probe::new(3 + id, Duration::from_millis(40), &ledger, &no);
        assert!(!fetch
            .try_complete_else_watch(op, [format!("t{id}")])
            .unwrap());
    }
    assert_eq!((produce.pending(), fetch.pending()), (3, 3));
    assert!(wait_until(Duration::from_secs(10), || ledger
        .total_completions()
        == 6));
    for id in 0..6 {
        assert_eq!(ledger.how(id), Some(Completion::Expired), "op {id}");
    }
    // One reaper for the group; none of the members has a thread of its own.
    if cfg!(target_os = "linux") {
        // (Names are cut at 15 bytes: the watchdog's begins `grp-one-reaper-`.)
        let reapers = threads_named("grp-one-reaper");
        assert_eq!(
            reapers.iter().filter(|n| *n == "grp-one-reaper").count(),
            1,
            "{reapers:?}"
        );
        assert!(threads_named("grp-one-produce").is_empty());
        assert!(threads_named("grp-one-fetch").is_empty());
    }
    // Each member's figures are its own.
    let (p, f) = (produce.stats(), fetch.stats());
    assert_eq!((p.expired, f.expired), (3, 3));
    assert_eq!((p.pending, f.pending), (0, 0), "{p:?} {f:?}");
    assert_eq!((p.watched_live, f.watched_live), (0, 0));
    assert_eq!(
        (produce.name(), fetch.name()),
        ("grp-one-produce", "grp-one-fetch")
    );
    assert_eq!(group.members(), 2);
    group.shutdown();
    assert_eq!(ledger.violations(), 0);
}

/// Row "shutdown": any member's `shutdown` is the group's; every member's pending
/// operations are answered `Shutdown`, later watches refused on every member, later
/// builds refused.
#[test]
fn a_members_shutdown_answers_every_member_and_closes_the_group() {
    let clock = ManualClock::new();
    let group = manual_group(&clock);
    let ledger = Ledger::new(4);
    let no = never();
    let a: Purgatory<u64, Probe> = PurgatoryBuilder::new().name("a").build_on(&group).unwrap();
    let b: Purgatory<u64, Probe> = PurgatoryBuilder::new().name("b").build_on(&group).unwrap();
    waits(a.watch(Probe::new(0, LONG, &ledger, &no), [1]));
    waits(a.watch(Probe::new(1, LONG, &ledger, &no), [2]));
    waits(b.watch_keyless(Probe::new(2, LONG, &ledger, &no)));
    a.shutdown();
    assert!(a.is_shutdown() && b.is_shutdown() && group.is_shutdown());
    for id in 0..3 {
        assert_eq!(ledger.how(id), Some(Completion::Shutdown), "op {id}");
        assert_eq!(ledger.expirations(id), 1, "op {id}");
    }
    assert!(matches!(
        b.watch(Probe::new(3, LONG, &ledger, &no), [1]),
        Err(WatchError::Shutdown(_))
    ));
    assert_eq!(
        (a.stats().expired_at_shutdown, b.stats().expired_at_shutdown),
        (2, 1)
    );
    assert_eq!((a.pending(), b.pending(), b.stats().refused), (0, 0, 1));
    let late = PurgatoryBuilder::<u64, Probe>::new().build_on(&group);
    assert!(matches!(late, Err(BuildError::GroupShutDown)), "{late:?}");
    // Again, from another member and from the group: nothing more to do.
    b.shutdown();
    group.shutdown();
    assert_eq!(ledger.total_completions(), 3);
    assert_eq!(ledger.violations(), 0);
}

/// Row "a member's last handle": dropping it does not shut the group down; the member's
/// operations are still answered by their timeouts, and the other members go on.
#[test]
fn a_member_dropped_still_answers_its_operations_by_their_timeouts() {
    let clock = ManualClock::new();
    let group = manual_group(&clock);
    let ledger = Ledger::new(3);
    let no = never();
    let gone: Purgatory<u64, Probe> = PurgatoryBuilder::new().build_on(&group).unwrap();
    let stays: Purgatory<u64, Probe> = PurgatoryBuilder::new().build_on(&group).unwrap();
    waits(gone.watch(Probe::new(0, Duration::from_millis(10), &ledger, &no), [1]));
    waits(gone.watch(Probe::new(1, LONG, &ledger, &no), [1]));
    drop(gone);
    assert!(!group.is_shutdown() && !stays.is_shutdown());
    assert_eq!(
        ledger.total_completions(),
        0,
        "nothing answered at the drop"
    );
    waits(stays.watch(Probe::new(2, Duration::from_millis(10), &ledger, &no), [1]));
    clock.advance(Duration::from_millis(20));
    assert_eq!(stays.advance_clock(Duration::ZERO), 2);
    assert_eq!(ledger.how(0), Some(Completion::Expired));
    assert_eq!(ledger.how(2), Some(Completion::Expired));
    assert_eq!(ledger.how(1), None, "its 200 s timeout has not come");
    // The group's shutdown answers what the dropped member still holds.
    group.shutdown();
    assert_eq!(ledger.how(1), Some(Completion::Shutdown));
    assert_eq!(ledger.violations(), 0);
}

/// Row "the group's last handle": when the group's handles and every member's are all
/// dropped, what is pending on every member is answered.
#[test]
fn dropping_the_group_and_every_member_answers_what_is_pending() {
    let group = TimerGroup::new("grp-drop");
    let ledger = Ledger::new(3);
    let no = never();
    let a: Purgatory<u64, Probe> = PurgatoryBuilder::new().build_on(&group).unwrap();
    let b: Purgatory<&'static str, Probe> = PurgatoryBuilder::new().build_on(&group).unwrap();
    waits(a.watch(Probe::new(0, LONG, &ledger, &no), [1]));
    waits(b.watch(Probe::new(1, LONG, &ledger, &no), ["x"]));
    waits(b.watch_keyless(Probe::new(2, LONG, &ledger, &no)));
    let weak = a.downgrade();
    drop(group);
    drop(a);
    assert!(weak.upgrade().is_some(), "a member lives on in its group");
    assert_eq!(ledger.total_completions(), 0, "b still holds the group");
    drop(b);
    for id in 0..3 {
        assert_eq!(ledger.how(id), Some(Completion::Shutdown), "op {id}");
    }
    assert!(weak.upgrade().is_none(), "the group is gone");
    assert_eq!(ledger.violations(), 0);
}

/// Row "relief": a member's callback held on the shared reaper does not hold another
/// member's timeouts; stand-ins take the others' work over, as within one purgatory.
#[test]
fn a_held_callback_of_one_member_does_not_make_another_member_late() {
    struct Timed {
        due: Instant,
        late: Arc<Mutex<Vec<Duration>>>,
        hold: Option<Arc<AtomicBool>>,
    }
    impl DelayedOperation for Timed {
        fn timeout(&self) -> Duration {
            self.due.saturating_duration_since(Instant::now())
        }
        fn try_complete(&mut self) -> bool {
            false
        }
        fn on_complete(&mut self, _: Completion) {
            if let Some(hold) = &self.hold {
                while !hold.load(SeqCst) {
                    std::thread::sleep(Duration::from_millis(1));
                }
            } else {
                let late = Instant::now().saturating_duration_since(self.due);
                self.late.lock().unwrap().push(late);
            }
        }
    }
    let group = TimerGroup::new("grp-relief");
    let slow: Purgatory<u32, Timed> = PurgatoryBuilder::new().build_on(&group).unwrap();
    let quick: Purgatory<u32, Timed> = PurgatoryBuilder::new().build_on(&group).unwrap();
    let late = Arc::new(Mutex::new(Vec::new()));
    let release = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let _ = slow
        .watch_keyless(Timed {
            due: start + Duration::from_millis(20),
            late: Arc::clone(&late),
            hold: Some(Arc::clone(&release)),
        })
        .unwrap();
    for i in 0..20u32 {
        let _ = quick
            .watch_keyless(Timed {
                due: start + Duration::from_millis(40 + 10 * u64::from(i)),
                late: Arc::clone(&late),
                hold: None,
            })
            .unwrap();
    }
    let answered = wait_until(Duration::from_secs(10), || late.lock().unwrap().len() == 20);
    release.store(true, SeqCst);
    assert!(
        answered,
        "the quick member's timeouts waited for the held callback"
    );
    let worst = late.lock().unwrap().iter().copied().max().unwrap();
    // The bound is 20 ms; a debug build on a shared machine gets room, far below the
    // hold (the callback is held until every other answer came, at least 230 ms).
    assert!(
        worst < Duration::from_millis(150),
        "worst lateness {worst:?}"
    );
    assert!(group.timer_stats().stand_ins > 0, "a stand-in took over");
    group.shutdown();
}

/// Row "building": the group refuses a purgatory past its `max_members`, one that sets
/// its own timer, and a zero `max_members`.
#[test]
fn building_on_a_group_refuses_what_it_cannot_honour() {
    let clock = ManualClock::new();
    let group = TimerGroup::builder()
        .timer(TimerBuilder::new().clock(clock.clone()).reaper(false))
        .max_members(2)
        .build()
        .unwrap();
    let _a: Purgatory<u8, Probe> = PurgatoryBuilder::new().build_on(&group).unwrap();
    let _b: Purgatory<u8, Probe> = PurgatoryBuilder::new().build_on(&group).unwrap();
    let full = PurgatoryBuilder::<u8, Probe>::new().build_on(&group);
    assert!(matches!(full, Err(BuildError::GroupFull(2))), "{full:?}");
    let own_timer = PurgatoryBuilder::<u8, Probe>::new()
        .timer(TimerBuilder::new())
        .build_on(&group);
    assert!(
        matches!(own_timer, Err(BuildError::TimerOnGroup)),
        "{own_timer:?}"
    );
    let zero = TimerGroup::builder().max_members(0).build();
    assert!(
        matches!(zero, Err(BuildError::InvalidMaxMembers(0))),
        "{zero:?}"
    );
    assert_eq!((group.members(), group.max_members()), (2, 2));
}

/// Row "exactly once across members": events, forces, cancels and resets on two members
/// while the shared reaper expires both, then the group's shutdown: each operation is
/// answered once or handed back.
#[test]
fn members_answer_each_operation_once_while_the_shared_reaper_expires_both() {
    const PER_MEMBER: usize = 2_000;
    let group = TimerGroup::new("grp-ledger");
    let ledger = Ledger::new(2 * PER_MEMBER);
    let ready: Arc<Vec<AtomicBool>> = Arc::new(
        (0..2 * PER_MEMBER)
            .map(|_| AtomicBool::new(false))
            .collect(),
    );
    let readiness: probe::Readiness = {
        let ready = Arc::clone(&ready);
        Arc::new(move |id, _| ready[id].load(SeqCst))
    };
    let a: Purgatory<u32, Probe> = PurgatoryBuilder::new().build_on(&group).unwrap();
    let b: Purgatory<u32, Probe> = PurgatoryBuilder::new().build_on(&group).unwrap();
    let returned = Arc::new(AtomicU32::new(0));
    let threads: Vec<_> = [a.clone(), b.clone()]
        .into_iter()
        .enumerate()
        .map(|(m, purgatory)| {
            let (ledger, ready, readiness, returned) = (
                Arc::clone(&ledger),
                Arc::clone(&ready),
                Arc::clone(&readiness),
                Arc::clone(&returned),
            );
            std::thread::spawn(move || {
                let mut rng = probe::Rng::new(37 + m as u64);
                for i in 0..PER_MEMBER {
                    let id = m * PER_MEMBER + i;
                    let key = rng.below(20) as u32;
                    let timeout = Duration::from_millis(1 + rng.below(20));
                    let op = Probe::new(id, timeout, &ledger, &readiness);
                    let Ok(purgatory::WatchOutcome::Pending(handle)) = purgatory.watch(op, [key])
                    else {
                        continue;
                    };
                    match rng.below(4) {
                        0 => {
                            ready[id].store(true, SeqCst);
                            purgatory.check_and_complete(&key);
                        }
                        1 => {
                            purgatory.force_complete(&handle);
                        }
                        2 => {
                            if purgatory.cancel(&handle).is_some() {
                                returned.fetch_add(1, SeqCst);
                            }
                        }
                        _ => {
                            purgatory.reset_timeout(&handle, Duration::from_millis(rng.below(5)));
                        }
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    group.shutdown();
    let returned = returned.load(SeqCst) as u64;
    assert_eq!(ledger.total_completions() + returned, 2 * PER_MEMBER as u64);
    for id in 0..2 * PER_MEMBER {
        assert!(ledger.completions(id) <= 1, "op {id} answered twice");
        assert_eq!(ledger.drops(id), 1, "op {id}");
    }
    assert_eq!(ledger.violations(), 0);
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!(sa.cancelled + sb.cancelled, returned);
    assert_eq!(
        sa.completed + sa.forced + sa.expired + sa.expired_at_shutdown,
        ledger.total_completions()
            - (sb.completed + sb.forced + sb.expired + sb.expired_at_shutdown)
    );
    assert_eq!((sa.pending, sb.pending), (0, 0));
}

/// Row "the last handle dropped in a tokio runtime": the group's last handle dropped in a
/// task does not shut it down on the worker (which would wait there for a callback held
/// on the reaper): the shutdown runs on the blocking pool, as for a purgatory built
/// alone. Before, the drop held the worker 1.5 s, as long as the callback.
#[cfg(feature = "tokio")]
#[test]
fn a_groups_last_drop_in_a_runtime_does_not_block_the_worker() {
    struct Held(Arc<AtomicU32>);
    impl DelayedOperation for Held {
        fn timeout(&self) -> Duration {
            Duration::from_millis(5)
        }
        fn try_complete(&mut self) -> bool {
            false
        }
        fn on_complete(&mut self, _: Completion) {
            self.0.fetch_add(1, SeqCst);
            std::thread::sleep(Duration::from_millis(1_500));
        }
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let started = Arc::new(AtomicU32::new(0));
    let took = runtime.block_on({
        let started = Arc::clone(&started);
        async move {
            let group = TimerGroup::new("grp-tokio-drop");
            let member: Purgatory<u64, Held> = PurgatoryBuilder::new().build_on(&group).unwrap();
            waits(member.watch(Held(Arc::clone(&started)), [1]));
            drop(member);
            while started.load(SeqCst) == 0 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let at = Instant::now();
            drop(group);
            at.elapsed()
        }
    });
    assert!(
        took < Duration::from_millis(500),
        "the drop held the worker {took:?}"
    );
}

/// Row "a member's last handle dropped", with `park_with`: a `Parked` dropped after its
/// member's last handle still cancels its operation (the member lives on in its group).
/// Before, the operation was answered as expired at its timeout instead.
#[cfg(feature = "tokio")]
#[test]
fn a_parked_dropped_after_its_members_last_handle_still_cancels() {
    struct Recorded(Arc<AtomicU32>, purgatory::Reply<()>);
    impl DelayedOperation for Recorded {
        fn timeout(&self) -> Duration {
            Duration::from_millis(100)
        }
        fn try_complete(&mut self) -> bool {
            false
        }
        fn on_complete(&mut self, how: Completion) {
            self.0.fetch_add(1, SeqCst);
            self.1.send(how, ());
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_time()
        .build()
        .unwrap();
    let group = TimerGroup::new("grp-parked");
    let answered = Arc::new(AtomicU32::new(0));
    let stays: Purgatory<u64, Recorded> = runtime.block_on(async {
        let member: Purgatory<u64, Recorded> = PurgatoryBuilder::new().build_on(&group).unwrap();
        let parked = member
            .park_with([1], |reply| Recorded(Arc::clone(&answered), reply))
            .unwrap();
        let weak = member.downgrade();
        drop(member);
        assert!(weak.upgrade().is_some(), "the member lives on in its group");
        drop(parked);
        weak.upgrade().unwrap()
    });
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        answered.load(SeqCst),
        0,
        "cancelled, not answered at its timeout"
    );
    let stats = stays.stats();
    assert_eq!((stats.cancelled, stats.expired, stats.pending), (1, 0, 0));
    drop(stays);
    group.shutdown();
}

/// Row "the group's last owner dropped": handles a `WeakPurgatory` upgraded to are not
/// owners, so feeders that upgrade, call and let go, overlapping, do not keep a group
/// alive once its `TimerGroup` and every member's owning handle are dropped. The group
/// shuts down at the last owner's drop, answering what is pending, and the upgraded
/// handle still in use sees it. Before (review of issue #37), an upgraded handle held the
/// group open, and overlapping feeders kept it open for good.
#[test]
fn an_upgraded_handle_does_not_keep_an_abandoned_group_alive() {
    let group = TimerGroup::new("grp-abandoned");
    let ledger = Ledger::new(1);
    let no = never();
    let member: Purgatory<u64, Probe> = PurgatoryBuilder::new().build_on(&group).unwrap();
    waits(member.watch(Probe::new(0, LONG, &ledger, &no), [1]));
    let weak = member.downgrade();
    let feeding = weak.upgrade().expect("an owner lives");
    drop(member);
    let also = weak
        .upgrade()
        .expect("the group still has an owner: its handle");
    drop(also);
    drop(group);
    assert_eq!(
        ledger.how(0),
        Some(Completion::Shutdown),
        "answered at the last owner's drop"
    );
    assert!(feeding.is_shutdown(), "the handle in use sees the shutdown");
    assert!(weak.upgrade().is_none(), "no owner left");
    assert!(matches!(
        feeding.watch(Probe::new(0, LONG, &Ledger::new(1), &no), [1]),
        Err(WatchError::Shutdown(_))
    ));
    drop(feeding);
    assert_eq!(ledger.violations(), 0);
}
