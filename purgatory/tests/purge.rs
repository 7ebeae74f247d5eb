//! Purging: entries of operations completed through another key (or forced, or expired)
//! stay listed until a check of their key drops them (once they are a quarter of its
//! list), or a purge does. `purge()` drops
//! them all at once; the reaper drops them by itself once `purge_interval` of them have
//! accumulated (shard by shard, until fewer than `purge_interval` remain), without
//! touching the operations still waiting.

mod probe;

use std::sync::mpsc;
use std::time::Duration;

use probe::{never, wait_until, Ledger, Probe};
use purgatory::{ManualClock, Purgatory, PurgatoryBuilder, TimerBuilder, WatchOutcome};

const LONG: Duration = Duration::from_secs(200);

#[test]
fn purge_drops_completed_entries_of_every_key() {
    let purgatory: Purgatory<&str, Probe> = PurgatoryBuilder::new()
        .purge_interval(1_000_000)
        .build()
        .unwrap();
    let ledger = Ledger::new(3);
    let no = never();
    let mut handles = Vec::new();
    for (id, keys) in [vec!["k1"], vec!["k1", "k2"], vec!["k1", "k2", "k3"]]
        .into_iter()
        .enumerate()
    {
        match purgatory
            .watch(Probe::new(id, LONG, &ledger, &no), keys)
            .unwrap()
        {
            WatchOutcome::Pending(handle) => handles.push(handle),
            WatchOutcome::Completed => panic!("never ready"),
        }
    }
    assert!(purgatory.force_complete(&handles[1]));
    assert!(purgatory.force_complete(&handles[2]));
    assert_eq!(purgatory.purge(), 5);
    let stats = purgatory.stats();
    assert_eq!((stats.watched, stats.keys, stats.pending), (1, 1, 1));
    assert_eq!(stats.purged, 5);
    assert_eq!(purgatory.purge(), 0, "nothing left to purge");
    assert!(!ledger.is_completed(0));
}

#[test]
fn the_reaper_purges_once_enough_completed_entries_accumulate() {
    const OPS: usize = 300;
    const FORCED: usize = 200;
    const INTERVAL: usize = 100;
    let purgatory: Purgatory<usize, Probe> = PurgatoryBuilder::new()
        .name("background-purge")
        .purge_interval(INTERVAL)
        .build()
        .unwrap();
    let ledger = Ledger::new(OPS);
    let no = never();
    let mut handles = Vec::new();
    for id in 0..OPS {
        match purgatory
            .watch(Probe::new(id, LONG, &ledger, &no), [id, OPS + id])
            .unwrap()
        {
            WatchOutcome::Pending(handle) => handles.push(handle),
            WatchOutcome::Completed => panic!("never ready"),
        }
    }
    for handle in &handles[..FORCED] {
        assert!(purgatory.force_complete(handle));
    }
    // Nobody checks any key: only the reaper can drop the 400 completed entries, and it
    // must bring them below the purge interval.
    let live = 2 * (OPS - FORCED);
    assert!(
        wait_until(Duration::from_secs(10), || purgatory.stats().watched
            < live + INTERVAL),
        "the reaper did not purge: {:?}",
        purgatory.stats()
    );
    // The reaper may still be mid-purge, and `stats()` reads the purged total and the
    // watcher entries one after the other: wait until two readings agree before asking
    // them to add up.
    let mut settled = purgatory.stats();
    assert!(
        wait_until(Duration::from_secs(10), || {
            std::thread::sleep(Duration::from_millis(20));
            let now = purgatory.stats();
            std::mem::replace(&mut settled, now) == now
        }),
        "the reaper never settled: {:?}",
        purgatory.stats()
    );
    let stats = settled;
    assert_eq!(
        stats.purged as usize + (stats.watched - live),
        2 * FORCED,
        "{stats:?}"
    );
    assert_eq!(stats.pending, OPS - FORCED);
    // The rest goes with an explicit purge.
    purgatory.purge();
    let stats = purgatory.stats();
    assert_eq!((stats.watched, stats.keys), (live, live));
    assert_eq!(stats.purged, 2 * FORCED as u64);
    for id in FORCED..OPS {
        assert!(!ledger.is_completed(id), "a purge completes nothing");
    }
    assert_eq!(ledger.violations(), 0);
}

#[test]
fn a_check_drops_completed_entries_once_they_are_a_quarter_of_its_list() {
    const HOT: usize = 100;
    let purgatory: Purgatory<usize, Probe> = PurgatoryBuilder::new()
        .purge_interval(1_000_000)
        .build()
        .unwrap();
    let ledger = Ledger::new(8);
    let no = never();
    let handles: Vec<_> = (0..8)
        .map(|id| {
            match purgatory
                .watch(Probe::new(id, LONG, &ledger, &no), [HOT, id])
                .unwrap()
            {
                WatchOutcome::Pending(handle) => handle,
                WatchOutcome::Completed => panic!("never ready"),
            }
        })
        .collect();
    assert_eq!(purgatory.stats().watched, 16);
    // One completed entry of eight: skipped by the check, left listed.
    assert!(purgatory.force_complete(&handles[0]));
    assert_eq!(purgatory.check_and_complete(&HOT), 0);
    assert_eq!(purgatory.stats().watched, 16);
    // Two of eight, a quarter: the check drops both.
    assert!(purgatory.force_complete(&handles[1]));
    assert_eq!(purgatory.check_and_complete(&HOT), 0);
    assert_eq!(purgatory.stats().watched, 14);
    // The rest of the list is intact and answerable.
    assert_eq!(purgatory.cancel_for_key(&HOT).len(), 6);
    assert_eq!(ledger.violations(), 0);
}

/// What an operation's `on_expiration` does with its own purgatory, on the reaper.
#[derive(Clone, Copy)]
enum OnExpiry {
    Purge,
    Check(&'static str),
}

/// An operation that never completes by itself and, when it expires, purges or checks a
/// key of its purgatory from its `on_expiration`, recording what the lists held then.
struct Reentrant {
    purgatory: std::sync::Arc<std::sync::Mutex<Option<Purgatory<&'static str, Reentrant>>>>,
    action: OnExpiry,
    /// `(dropped by the purge, or completed by the check; watcher entries after it)`.
    seen: std::sync::mpsc::Sender<(usize, usize)>,
}

impl purgatory::DelayedOperation for Reentrant {
    fn timeout(&self) -> Duration {
        Duration::from_millis(20)
    }

    fn try_complete(&mut self) -> bool {
        false
    }

    fn on_complete(&mut self, _: purgatory::Completion) {}

    fn on_expiration(&mut self) {
        let purgatory = self.purgatory.lock().unwrap().clone().expect("set");
        let done = match self.action {
            OnExpiry::Purge => purgatory.purge(),
            OnExpiry::Check(key) => purgatory.check_and_complete(&key),
        };
        let _ = self.seen.send((done, purgatory.stats().watched));
    }
}

/// By the time its callbacks run, an expired operation's entries are stale to a purge
/// and to a check of its key, as for every other completion (the table in
/// `docs/purgatory.md`): a callback of the reaper's inline expiry that purges, or checks
/// its key, drops them. (The reaper once freed its batch's slots 32 at a time and set
/// their tags only then, so they still read as waiting to the callbacks of the batch.)
fn expiry_callback_sees_own_entries_stale(action: OnExpiry, keys: &[&'static str]) {
    let purgatory: Purgatory<&'static str, Reentrant> = PurgatoryBuilder::new()
        .purge_interval(1_000_000)
        .build()
        .unwrap();
    let shared = std::sync::Arc::new(std::sync::Mutex::new(Some(purgatory.clone())));
    let (seen, answers) = std::sync::mpsc::channel();
    let op = Reentrant {
        purgatory: std::sync::Arc::clone(&shared),
        action,
        seen,
    };
    match purgatory.watch(op, keys.iter().copied()).unwrap() {
        WatchOutcome::Pending(_) => {}
        WatchOutcome::Completed => panic!("never ready"),
    }
    assert_eq!(purgatory.stats().watched, keys.len());
    let got = answers
        .recv_timeout(Duration::from_secs(30))
        .expect("expired");
    shared.lock().unwrap().take();
    let (done, watched) = got;
    match action {
        OnExpiry::Purge => assert_eq!(
            (done, watched),
            (keys.len(), 0),
            "the purge from its own on_expiration dropped (n, left m entries)"
        ),
        OnExpiry::Check(_) => assert_eq!(
            (done, watched),
            (0, 0),
            "the check from its own on_expiration (completed n, left m entries)"
        ),
    }
}

#[test]
fn a_purge_from_an_expiry_callback_drops_the_expired_operations_entries() {
    expiry_callback_sees_own_entries_stale(OnExpiry::Purge, &["a", "b"]);
}

#[test]
fn a_check_from_an_expiry_callback_drops_the_expired_operations_entry() {
    expiry_callback_sees_own_entries_stale(OnExpiry::Check("a"), &["a"]);
}

/// A completion made a purge due after the reaper's last housekeeping, and the round that
/// applies its timer cancel finds the operation's bucket due: taking the emptied bucket
/// leaves the timer empty. The round must still come back to its housekeeping, which
/// purges, instead of sleeping on the wait decided before the completion (none, with
/// nothing due to purge then): once, that round slept until the next watch.
#[test]
fn a_completion_whose_bucket_is_due_at_the_next_round_is_still_purged() {
    let clock = ManualClock::new();
    let purgatory: Purgatory<&str, Probe> = PurgatoryBuilder::new()
        .name("due-then-purged")
        .purge_interval(1)
        .timer(TimerBuilder::new().clock(clock.clone()).reaper(false))
        .build()
        .unwrap();
    let ledger = Ledger::new(2);
    let WatchOutcome::Pending(handle) = purgatory
        .watch(
            Probe::new(0, Duration::from_millis(10), &ledger, &never()),
            ["k"],
        )
        .unwrap()
    else {
        panic!("never ready");
    };
    // The timer cancel is queued for the next round; the entry of "k" is stale.
    assert!(purgatory.force_complete(&handle));
    clock.advance(Duration::from_millis(20));
    let (returned, rx) = mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            returned
                .send(purgatory.advance_clock(Duration::MAX))
                .unwrap()
        });
        let came_back = rx.recv_timeout(Duration::from_secs(10));
        if came_back.is_err() {
            // Asleep without limit: a watch due at once wakes it, so the test ends.
            let wake = Probe::new(1, Duration::ZERO, &ledger, &never());
            let _ = purgatory.watch(wake, ["wake"]);
            clock.advance(Duration::from_millis(10));
        }
        assert_eq!(came_back, Ok(0), "the round slept instead of purging");
    });
    // That round's housekeeping purged, unless the process's unmapping thread was busy
    // (another test's memory): it then asked for a round soon, which these are.
    assert!(
        wait_until(Duration::from_secs(5), || {
            purgatory.advance_clock(Duration::ZERO);
            purgatory.stats().purged == 1
        }),
        "not purged"
    );
    let stats = purgatory.stats();
    assert_eq!((stats.watched, stats.keys), (0, 0));
    assert_eq!((stats.forced, stats.expired, stats.pending), (1, 0, 0));
    assert!(ledger.is_completed(0));
}
