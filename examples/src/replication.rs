//! How far each replica of a partition has come, and the high watermark that follows.
//!
//! Invariants:
//! - Every follower offset is at most the leader's log end offset, and never goes back.
//! - The high watermark is the smallest log end offset over the in-sync replicas, the leader
//!   included; every simulated follower stays in the in-sync set (a stalled follower holds
//!   the high watermark back, which is what makes acks=all produces time out). With no
//!   followers the high watermark is the leader's log end offset.

/// Replica progress of one partition.
#[derive(Debug, Clone)]
pub struct ReplicaProgress {
    leader_end: i64,
    followers: Vec<i64>,
}

impl ReplicaProgress {
    /// A partition with `followers` in-sync followers, all at offset 0.
    pub fn new(followers: usize) -> Self {
        Self {
            leader_end: 0,
            followers: vec![0; followers],
        }
    }

    /// The leader's log grew to `end_offset`.
    pub fn leader_appended(&mut self, end_offset: i64) {
        self.leader_end = self.leader_end.max(end_offset);
    }

    /// Follower `follower` has fetched everything below `offset`. Unknown followers and
    /// offsets going back are ignored; offsets past the leader's end are clamped.
    pub fn follower_reached(&mut self, follower: usize, offset: i64) {
        let leader_end = self.leader_end;
        if let Some(at) = self.followers.get_mut(follower) {
            *at = (*at).max(offset.min(leader_end));
        }
    }

    /// The high watermark: every in-sync replica holds every offset below it.
    pub fn high_watermark(&self) -> i64 {
        self.followers
            .iter()
            .copied()
            .fold(self.leader_end, i64::min)
    }

    /// The leader's log end offset.
    pub fn leader_end(&self) -> i64 {
        self.leader_end
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_followers_the_high_watermark_is_the_log_end() {
        let mut replicas = ReplicaProgress::new(0);
        replicas.leader_appended(7);
        assert_eq!(replicas.high_watermark(), 7);
    }

    #[test]
    fn the_slowest_follower_holds_the_high_watermark() {
        let mut replicas = ReplicaProgress::new(2);
        replicas.leader_appended(10);
        assert_eq!(replicas.high_watermark(), 0);
        replicas.follower_reached(0, 10);
        assert_eq!(replicas.high_watermark(), 0);
        replicas.follower_reached(1, 4);
        assert_eq!(replicas.high_watermark(), 4);
        replicas.follower_reached(1, 10);
        assert_eq!(replicas.high_watermark(), 10);
    }

    #[test]
    fn follower_offsets_never_go_back_or_pass_the_leader() {
        let mut replicas = ReplicaProgress::new(1);
        replicas.leader_appended(5);
        replicas.follower_reached(0, 9);
        assert_eq!(replicas.high_watermark(), 5);
        replicas.follower_reached(0, 2);
        assert_eq!(replicas.high_watermark(), 5);
        replicas.follower_reached(3, 1);
        assert_eq!(replicas.high_watermark(), 5);
    }
}
