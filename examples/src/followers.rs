//! Simulated followers: threads that copy the leader's log a fixed delay after each append.
//!
//! Each follower is one thread with a channel of append notices `(when, partition, log end
//! offset)`. A notice becomes due `lag` after its append; the thread sleeps until the oldest
//! notice is due (or a new notice arrives), then reports every due notice, at most one
//! report per partition per wake-up (the largest offset wins), through
//! [`FollowerListener::follower_reached`].
//!
//! Invariants:
//! - A follower never reports an offset before `lag` has passed since the append that
//!   produced it (notices are queued in append order, so the oldest is due first).
//! - The listener runs on the follower's thread, with no lock of this module held.
//! - Stalled followers (and a set of zero followers) start no thread and report nothing.
//! - [`FollowerSet::shutdown`] (or drop) closes the channels and joins the threads; a thread
//!   exits as soon as its channel is closed, even with notices still pending.

use std::collections::VecDeque;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::partition::PartitionKey;

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

#[derive(Debug, Clone, Copy)]
struct AppendNotice {
    appended_at: Instant,
    partition: PartitionKey,
    end_offset: i64,
}

/// The running followers of a broker (or of a demo).
pub struct FollowerSet {
    senders: Vec<mpsc::Sender<AppendNotice>>,
    threads: Vec<JoinHandle<()>>,
}

impl FollowerSet {
    /// Starts `config.count` follower threads (none when stalled).
    pub fn start(config: FollowerConfig, listener: Arc<dyn FollowerListener>) -> FollowerSet {
        let mut set = FollowerSet {
            senders: Vec::new(),
            threads: Vec::new(),
        };
        if config.stalled {
            return set;
        }
        for follower in 0..config.count {
            let (sender, receiver) = mpsc::channel();
            let listener = Arc::clone(&listener);
            let lag = config.lag;
            let thread = std::thread::Builder::new()
                .name(format!("follower-{follower}"))
                .spawn(move || follow(follower, lag, receiver, listener.as_ref()))
                .expect("spawning a follower thread");
            set.senders.push(sender);
            set.threads.push(thread);
        }
        set
    }

    /// The leader appended to `partition`, whose log now ends at `end_offset`.
    pub fn leader_appended(&self, partition: PartitionKey, end_offset: i64) {
        let notice = AppendNotice {
            appended_at: Instant::now(),
            partition,
            end_offset,
        };
        for sender in &self.senders {
            // A follower whose thread has gone (shutdown) just misses the notice.
            let _ = sender.send(notice);
        }
    }

    /// Stops and joins every follower thread.
    pub fn shutdown(&mut self) {
        self.senders.clear();
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

fn follow(
    follower: usize,
    lag: Duration,
    notices: mpsc::Receiver<AppendNotice>,
    listener: &dyn FollowerListener,
) {
    let mut pending: VecDeque<AppendNotice> = VecDeque::new();
    let mut due_now: Vec<(PartitionKey, i64)> = Vec::new();
    loop {
        let next = match pending.front() {
            None => notices.recv().map_err(|_| RecvTimeoutError::Disconnected),
            Some(oldest) => {
                let due = oldest.appended_at + lag;
                let now = Instant::now();
                if due <= now {
                    report_due(&mut pending, lag, now, &mut due_now);
                    for &(partition, offset) in &due_now {
                        listener.follower_reached(partition, follower, offset);
                    }
                    continue;
                }
                notices.recv_timeout(due - now)
            }
        };
        match next {
            Ok(notice) => pending.push_back(notice),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// Takes every notice due at `now` off the queue, keeping the largest offset per partition.
fn report_due(
    pending: &mut VecDeque<AppendNotice>,
    lag: Duration,
    now: Instant,
    due_now: &mut Vec<(PartitionKey, i64)>,
) {
    due_now.clear();
    while let Some(notice) = pending.front() {
        if notice.appended_at + lag > now {
            break;
        }
        match due_now.iter_mut().find(|(p, _)| *p == notice.partition) {
            Some((_, offset)) => *offset = (*offset).max(notice.end_offset),
            None => due_now.push((notice.partition, notice.end_offset)),
        }
        pending.pop_front();
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
        let mut pending: VecDeque<AppendNotice> = [(0, 1), (1, 4), (0, 3)]
            .into_iter()
            .map(|(p, end_offset)| AppendNotice {
                appended_at: now,
                partition: PartitionKey(p),
                end_offset,
            })
            .collect();
        pending.push_back(AppendNotice {
            appended_at: now + Duration::from_secs(60),
            partition: PartitionKey(0),
            end_offset: 9,
        });
        let mut due = Vec::new();
        report_due(&mut pending, Duration::ZERO, now, &mut due);
        assert_eq!(due, vec![(PartitionKey(0), 3), (PartitionKey(1), 4)]);
        assert_eq!(pending.len(), 1);
    }
}
