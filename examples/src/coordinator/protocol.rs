//! The coordinator example's wire format: fixed-size little-endian frames, so that what
//! the load measures is the sessions' path, not a codec.
//!
//! | frame | bytes | fields |
//! |---|---|---|
//! | request | 5 | kind (`JOIN`, `HEARTBEAT`, `STATS`), member id (u32) |
//! | answer | 6 | kind, member id, error code (`NONE`, `UNKNOWN_MEMBER_ID`, `REBALANCE_IN_PROGRESS`) |
//! | stats answer | 1 + 8 x 4 | `STATS`, then [`Stats`]'s four fields as u64 |
//!
//! A connection may have many requests in flight; answers carry the member id, so a join
//! parked at its group's barrier does not hold back the heartbeats behind it.

/// Joins the member's group: answered once every member of the group has joined (the
/// barrier) or the rebalance timeout passed; the member's session starts then.
pub const JOIN: u8 = 1;
/// Keeps the member's session alive: its deadline moves to now + the session timeout.
pub const HEARTBEAT: u8 = 2;
/// Asks for the server's [`Stats`].
pub const STATS: u8 = 3;

/// No error.
pub const NONE: u8 = 0;
/// Kafka's `REBALANCE_IN_PROGRESS` (27): the join barrier timed out, or the server is
/// shutting down.
pub const REBALANCE_IN_PROGRESS: u8 = 27;
/// Kafka's `UNKNOWN_MEMBER_ID` (25): no live session (never joined, or expired).
pub const UNKNOWN_MEMBER_ID: u8 = 25;

/// Bytes of a request.
pub const REQUEST_LEN: usize = 5;
/// Bytes of an answer.
pub const ANSWER_LEN: usize = 6;
/// Bytes of a stats answer.
pub const STATS_LEN: usize = 1 + 8 * 4;

/// What the server measured of its sessions' expiries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Sessions expired.
    pub expired: u64,
    /// How late the latest-answered expiry's 99th percentile was, microseconds.
    pub late_p99_us: u64,
    /// The latest expiry, microseconds after its deadline.
    pub late_max_us: u64,
    /// Heartbeats answered `UNKNOWN_MEMBER_ID`.
    pub unknown: u64,
}

/// A request frame.
pub fn request(kind: u8, member: u32) -> [u8; REQUEST_LEN] {
    let mut frame = [0; REQUEST_LEN];
    frame[0] = kind;
    frame[1..].copy_from_slice(&member.to_le_bytes());
    frame
}

/// Reads a request frame: `(kind, member)`.
pub fn read_request(frame: &[u8; REQUEST_LEN]) -> (u8, u32) {
    let member = u32::from_le_bytes(frame[1..].try_into().expect("4 bytes"));
    (frame[0], member)
}

/// An answer frame.
pub fn answer(kind: u8, member: u32, error: u8) -> [u8; ANSWER_LEN] {
    let mut frame = [0; ANSWER_LEN];
    frame[0] = kind;
    frame[1..5].copy_from_slice(&member.to_le_bytes());
    frame[5] = error;
    frame
}

/// Reads an answer frame: `(kind, member, error)`.
pub fn read_answer(frame: &[u8; ANSWER_LEN]) -> (u8, u32, u8) {
    let member = u32::from_le_bytes(frame[1..5].try_into().expect("4 bytes"));
    (frame[0], member, frame[5])
}

/// A stats answer frame.
pub fn stats_answer(stats: Stats) -> [u8; STATS_LEN] {
    let mut frame = [0; STATS_LEN];
    frame[0] = STATS;
    let fields = [
        stats.expired,
        stats.late_p99_us,
        stats.late_max_us,
        stats.unknown,
    ];
    for (i, field) in fields.iter().enumerate() {
        frame[1 + 8 * i..9 + 8 * i].copy_from_slice(&field.to_le_bytes());
    }
    frame
}

/// Reads the body of a stats answer (the bytes after its kind).
pub fn read_stats(body: &[u8; STATS_LEN - 1]) -> Stats {
    let field = |i: usize| u64::from_le_bytes(body[8 * i..8 * i + 8].try_into().expect("8"));
    Stats {
        expired: field(0),
        late_p99_us: field(1),
        late_max_us: field(2),
        unknown: field(3),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_read_back() {
        assert_eq!(read_request(&request(HEARTBEAT, 70_000)), (HEARTBEAT, 70_000));
        assert_eq!(
            read_answer(&answer(JOIN, 9, REBALANCE_IN_PROGRESS)),
            (JOIN, 9, REBALANCE_IN_PROGRESS)
        );
        let stats = Stats {
            expired: 1,
            late_p99_us: 2,
            late_max_us: 3,
            unknown: u64::MAX,
        };
        let frame = stats_answer(stats);
        assert_eq!(read_stats(frame[1..].try_into().unwrap()), stats);
    }
}
