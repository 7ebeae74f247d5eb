//! Simulated followers: threads that copy the leader's log a fixed delay after each append.
//!
//! Each follower is one thread with a queue of append notices. A notice becomes due `lag`
//! after its append; notices are coalesced as they are queued: one due within [`TICK`]
//! after the first notice of the queue's last slot joins that slot (the slot keeps the
//! largest end offset per partition, and is due when its last notice is, so a lone notice
//! is not delayed). The thread sleeps until the oldest slot is due (or the queue changes),
//! takes every due slot at once and reports, once per partition (the largest offset
//! wins), through [`FollowerListener::follower_reached`]: one report covers every notice
//! due, whatever the append rate.
//!
//! | queue state                         | the thread                                      |
//! |-------------------------------------|-------------------------------------------------|
//! | empty, running                      | waits for a notice                              |
//! | oldest slot not due                 | waits until it is due (or a notice, or a stop)  |
//! | some slots due                      | takes them all, then reports (no lock held)     |
//! | stopped (with or without notices)   | returns at once, between two reports            |
//!
//! Invariants:
//! - A follower never reports an offset before `lag` has passed since the append that
//!   produced it, and reports it at most `TICK` later (plus the time the reports before it
//!   take): slots are queued in append order and a slot is due after each of its notices.
//! - The queue holds at most `lag / TICK + 1` slots, each of at most one entry per
//!   partition: its memory does not grow with the append rate.
//! - The listener runs on the follower's thread, with no lock of this module held.
//! - Stalled followers (and a set of zero followers) start no thread and report nothing.
//! - [`FollowerSet::shutdown`] (or drop) marks every queue stopped and joins the threads; a
//!   thread returns as soon as it sees the mark (before its next report), whatever it still
//!   has queued, so a shutdown waits for one report at most, never for a backlog.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::partition::PartitionKey;

/// How long after its first notice a slot of the queue takes more notices: the most a
/// report is delayed past `lag` by coalescing, and the least time between two reports of a
/// follower that keeps up.
pub const TICK: Duration = Duration::from_millis(1);

/// How the simulated followers behave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FollowerConfig {
    /// Number of followers (each an in-sync replica of every partition).
    pub count: usize,
    /// How long after an append a follower has copied it.
    pub lag: Duration,
    /// Followers that never copy anything (acks=all produces then time out).
    pub stalled: bool,
}

/// Told when a follower has copied a partition up to an offset.
pub trait FollowerListener: Send + Sync + 'static {
    /// `follower` now holds every offset of `partition` below `offset`.
    fn follower_reached(&self, partition: PartitionKey, follower: usize, offset: i64);
}

/// Notices due at the same time (within [`TICK`]): the largest end offset per partition.
#[derive(Debug)]
struct Slot {
    /// The first notice's due time: later notices join while due by `opened + TICK`.
    opened: Instant,
    /// The last notice's due time: the slot is reported then, after every notice it holds
    /// is due (a lone notice is not delayed at all).
    due: Instant,
    ends: HashMap<PartitionKey, i64>,
}

impl Slot {
    fn due_at(&self) -> Instant {
        self.due
    }
}

#[derive(Debug, Default)]
struct Queue {
    slots: VecDeque<Slot>,
    stopped: bool,
}

impl Queue {
    /// Queues `end_offset` of `partition`, due at `due`.
    fn push(&mut self, due: Instant, partition: PartitionKey, end_offset: i64) {
        let slot = match self.slots.back_mut() {
            Some(slot) if due <= slot.opened + TICK => slot,
            _ => {
                self.slots.push_back(Slot {
                    opened: due,
                    due,
                    ends: HashMap::new(),
                });
                self.slots.back_mut().expect("just pushed")
            }
        };
        slot.due = slot.due.max(due);
        merge(&mut slot.ends, partition, end_offset);
    }

    /// Moves every slot due at `now` into `due_now`, merged per partition.
    fn take_due(&mut self, now: Instant, due_now: &mut HashMap<PartitionKey, i64>) {
        due_now.clear();
        while self.slots.front().is_some_and(|slot| slot.due_at() <= now) {
            let slot = self.slots.pop_front().expect("checked");
            for (partition, end_offset) in slot.ends {
                merge(due_now, partition, end_offset);
            }
        }
    }
}

fn merge(ends: &mut HashMap<PartitionKey, i64>, partition: PartitionKey, end_offset: i64) {
    let offset = ends.entry(partition).or_insert(end_offset);
    *offset = (*offset).max(end_offset);
}

/// One follower's queue, shared by the leader (who pushes) and the follower's thread.
#[derive(Debug, Default)]
struct Shared {
    queue: Mutex<Queue>,
    changed: Condvar,
}

/// The running followers of a broker (or of a demo).
pub struct FollowerSet {
    lag: Duration,
    followers: Vec<Arc<Shared>>,
    threads: Vec<JoinHandle<()>>,
}

impl FollowerSet {
    /// Starts `config.count` follower threads (none when stalled).
    pub fn start(config: FollowerConfig, listener: Arc<dyn FollowerListener>) -> FollowerSet {
        let mut set = FollowerSet {
            lag: config.lag,
            followers: Vec::new(),
            threads: Vec::new(),
        };
        if config.stalled {
            return set;
        }
        for follower in 0..config.count {
            let shared = Arc::new(Shared::default());
            let listener = Arc::clone(&listener);
            let thread = {
                let shared = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("follower-{follower}"))
                    .spawn(move || follow(follower, &shared, listener.as_ref()))
                    .expect("spawning a follower thread")
            };
            set.followers.push(shared);
            set.threads.push(thread);
        }
        set
    }

    /// The leader appended to `partition`, whose log now ends at `end_offset`.
    pub fn leader_appended(&self, partition: PartitionKey, end_offset: i64) {
        let due = Instant::now() + self.lag;
        for follower in &self.followers {
            let mut queue = follower.queue.lock();
            if queue.stopped {
                // A follower that has stopped (shutdown) just misses the notice.
                continue;
            }
            let was_empty = queue.slots.is_empty();
            queue.push(due, partition, end_offset);
            drop(queue);
            if was_empty {
                // Otherwise the thread already waits for an earlier slot.
                follower.changed.notify_one();
            }
        }
    }

    /// Stops and joins every follower thread, whatever they still have queued.
    pub fn shutdown(&mut self) {
        for follower in &self.followers {
            follower.queue.lock().stopped = true;
            follower.changed.notify_one();
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

impl Drop for FollowerSet {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn follow(follower: usize, shared: &Shared, listener: &dyn FollowerListener) {
    let mut due_now: HashMap<PartitionKey, i64> = HashMap::new();
    loop {
        {
            let mut queue = shared.queue.lock();
            loop {
                if queue.stopped {
                    return;
                }
                match queue.slots.front().map(Slot::due_at) {
                    None => shared.changed.wait(&mut queue),
                    Some(due) if due > Instant::now() => {
                        shared.changed.wait_until(&mut queue, due);
                    }
                    Some(_) => break,
                }
            }
            queue.take_due(Instant::now(), &mut due_now);
        }
        for (&partition, &offset) in &due_now {
            if shared.queue.lock().stopped {
                return;
            }
            listener.follower_reached(partition, follower, offset);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;

    #[derive(Default)]
    struct Recorder {
        reports: Mutex<Vec<(PartitionKey, usize, i64, Instant)>>,
    }

    impl FollowerListener for Recorder {
        fn follower_reached(&self, partition: PartitionKey, follower: usize, offset: i64) {
            self.reports
                .lock()
                .push((partition, follower, offset, Instant::now()));
        }
    }

    fn wait_for_reports(recorder: &Recorder, count: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while recorder.reports.lock().len() < count && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn every_follower_reports_an_append_after_the_lag() {
        let recorder = Arc::new(Recorder::default());
        let config = FollowerConfig {
            count: 2,
            lag: Duration::from_millis(30),
            stalled: false,
        };
        let mut set = FollowerSet::start(config, recorder.clone());
        let appended_at = Instant::now();
        set.leader_appended(PartitionKey(3), 5);
        wait_for_reports(&recorder, 2);
        set.shutdown();
        let reports = recorder.reports.lock();
        let mut followers: Vec<usize> = reports.iter().map(|r| r.1).collect();
        followers.sort_unstable();
        assert_eq!(followers, vec![0, 1]);
        for &(partition, _, offset, at) in reports.iter() {
            assert_eq!((partition, offset), (PartitionKey(3), 5));
            assert!(at.duration_since(appended_at) >= config.lag);
        }
    }

    #[test]
    fn stalled_followers_report_nothing() {
        let recorder = Arc::new(Recorder::default());
        let config = FollowerConfig {
            count: 2,
            lag: Duration::ZERO,
            stalled: true,
        };
        let mut set = FollowerSet::start(config, recorder.clone());
        set.leader_appended(PartitionKey(0), 1);
        std::thread::sleep(Duration::from_millis(50));
        set.shutdown();
        assert!(recorder.reports.lock().is_empty());
    }

    #[test]
    fn shutdown_returns_promptly_with_notices_pending() {
        let recorder = Arc::new(Recorder::default());
        let config = FollowerConfig {
            count: 1,
            lag: Duration::from_secs(3600),
            stalled: false,
        };
        let mut set = FollowerSet::start(config, recorder.clone());
        set.leader_appended(PartitionKey(0), 1);
        let started = Instant::now();
        set.shutdown();
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(recorder.reports.lock().is_empty());
    }

    #[test]
    fn due_notices_are_merged_per_partition() {
        let now = Instant::now();
        let mut queue = Queue::default();
        for (p, end_offset, after) in [(0, 1, 0), (1, 4, 1), (0, 3, 2)] {
            queue.push(
                now + Duration::from_micros(after),
                PartitionKey(p),
                end_offset,
            );
        }
        queue.push(now + Duration::from_secs(60), PartitionKey(0), 9);
        let mut due = HashMap::new();
        queue.take_due(now + Duration::from_micros(1), &mut due);
        assert!(due.is_empty(), "a slot is due when its last notice is");
        queue.take_due(now + Duration::from_micros(2), &mut due);
        assert_eq!(
            due,
            HashMap::from([(PartitionKey(0), 3), (PartitionKey(1), 4)])
        );
        assert_eq!(queue.slots.len(), 1);
    }

    #[test]
    fn a_flood_of_notices_takes_one_slot_per_tick() {
        let now = Instant::now();
        let mut queue = Queue::default();
        for i in 0..100_000 {
            let due = now + Duration::from_micros(i / 10);
            queue.push(due, PartitionKey((i % 3) as u32), i as i64);
        }
        // 10 ms of notices: about one slot per tick, each one entry per partition.
        assert!(queue.slots.len() <= 11, "{} slots", queue.slots.len());
        assert!(queue.slots.iter().all(|slot| slot.ends.len() == 3));
        let mut due = HashMap::new();
        queue.take_due(now + Duration::from_secs(1), &mut due);
        assert_eq!(
            due,
            HashMap::from([
                (PartitionKey(0), 99_999),
                (PartitionKey(1), 99_997),
                (PartitionKey(2), 99_998)
            ])
        );
    }

    #[derive(Default)]
    struct SlowRecorder {
        reports: std::sync::atomic::AtomicUsize,
    }

    impl FollowerListener for SlowRecorder {
        fn follower_reached(&self, _: PartitionKey, _: usize, _: i64) {
            self.reports
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_follower_behind_reports_its_whole_backlog_at_once_and_stops_promptly() {
        let recorder = Arc::new(SlowRecorder::default());
        let config = FollowerConfig {
            count: 1,
            lag: Duration::ZERO,
            stalled: false,
        };
        let mut set = FollowerSet::start(config, recorder.clone());
        // 100,000 appends while every report takes 1 ms: one report per notice would take
        // 100 s (and a shutdown would wait for them all).
        for offset in 1..=100_000 {
            set.leader_appended(PartitionKey(0), offset);
        }
        std::thread::sleep(Duration::from_millis(200));
        let started = Instant::now();
        set.shutdown();
        assert!(started.elapsed() < Duration::from_secs(5));
        let reports = recorder.reports.load(std::sync::atomic::Ordering::Relaxed);
        assert!(reports < 1_000, "{reports} reports for 100,000 notices");
    }
}
