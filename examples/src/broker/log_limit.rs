//! Rate-limited logging of what clients do wrong: one fuzzing client must not make the
//! broker write thousands of lines a second (issue #29: 3,000 a second).
//!
//! Each line has a *kind*: for `closing PEER: REASON` the start of the reason, otherwise
//! the start of the line, up to its first digit, parenthesis or colon (so `malformed
//! request body (v4): ...` and `unknown API key 77` are kinds, whatever the peer, version or
//! key). Each kind has a token bucket of [`BURST`] lines refilled at [`PER_SECOND`] lines a
//! second.
//!
//! Invariants:
//! - A kind writes at most `BURST + PER_SECOND x t` lines over any `t` seconds, plus one
//!   "suppressed" line before each line let through after some were dropped, so nothing
//!   is dropped silently: the count is told with the next line of the kind let through.
//! - At most [`MAX_KINDS`] kinds are tracked; lines of any further kind share one bucket,
//!   so all lines together stay within `(MAX_KINDS + 1) x` the rate of one kind.

use std::collections::HashMap;
use std::time::Instant;

use parking_lot::Mutex;

/// Lines a kind may write at once.
pub const BURST: f64 = 10.0;
/// Lines a kind may write per second in the long run.
pub const PER_SECOND: f64 = 5.0;
/// Kinds tracked with their own bucket.
pub const MAX_KINDS: usize = 64;
/// Longest kind kept, in bytes.
const MAX_KIND_BYTES: usize = 48;
/// The kind of lines beyond [`MAX_KINDS`].
const OTHER: &str = "other";

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    refilled: Instant,
    suppressed: u64,
}

/// The buckets of every kind.
#[derive(Debug, Default)]
pub struct LogLimit {
    kinds: Mutex<HashMap<String, Bucket>>,
}

/// What to write for one line.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Write it, after saying that `suppressed` lines of `kind` were dropped (if any).
    Write {
        /// Lines of the kind dropped since the last one written.
        suppressed: u64,
        /// The kind.
        kind: String,
    },
    /// Drop it (counted).
    Drop,
}

impl LogLimit {
    /// Whether `line`, logged at `now`, is written.
    pub fn check(&self, line: &str, now: Instant) -> Verdict {
        let mut kinds = self.kinds.lock();
        let mut kind = kind_of(line);
        if !kinds.contains_key(kind) && kinds.len() >= MAX_KINDS {
            kind = OTHER;
        }
        let bucket = kinds.entry(kind.to_string()).or_insert(Bucket {
            tokens: BURST,
            refilled: now,
            suppressed: 0,
        });
        let elapsed = now.saturating_duration_since(bucket.refilled).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * PER_SECOND).min(BURST);
        bucket.refilled = now;
        if bucket.tokens < 1.0 {
            bucket.suppressed += 1;
            return Verdict::Drop;
        }
        bucket.tokens -= 1.0;
        let suppressed = std::mem::take(&mut bucket.suppressed);
        Verdict::Write {
            suppressed,
            kind: kind.to_string(),
        }
    }
}

/// The kind of `line` (see the module doc).
fn kind_of(line: &str) -> &str {
    let reason = match line.strip_prefix("closing ") {
        Some(rest) => rest.split_once(": ").map_or(rest, |(_, reason)| reason),
        None => line,
    };
    let end = reason
        .char_indices()
        .find(|&(_, c)| c.is_ascii_digit() || matches!(c, '(' | ':' | '['))
        .map_or(reason.len(), |(i, _)| i);
    let mut kind = reason[..end].trim_end();
    if kind.len() > MAX_KIND_BYTES {
        let mut cut = MAX_KIND_BYTES;
        while !kind.is_char_boundary(cut) {
            cut -= 1;
        }
        kind = &kind[..cut];
    }
    kind
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn kinds_ignore_peers_and_numbers() {
        assert_eq!(
            kind_of("closing 127.0.0.1:5000: malformed request body (v4): oops"),
            "malformed request body"
        );
        assert_eq!(
            kind_of("closing 127.0.0.9:1: unknown API key 77"),
            "unknown API key"
        );
        assert_eq!(kind_of("refused 3 connection(s)"), "refused");
    }

    #[test]
    fn a_flood_of_one_kind_is_cut_to_the_rate_and_counted() {
        let limit = LogLimit::default();
        let start = Instant::now();
        let (mut written, mut told) = (0u64, 0u64);
        // 3,000 lines in one second.
        for i in 0..3_000u32 {
            let at = start + Duration::from_micros(u64::from(i) * 333);
            let line = format!("closing 127.0.0.1:{i}: unknown API key {i}");
            if let Verdict::Write { suppressed, .. } = limit.check(&line, at) {
                written += 1;
                told += suppressed;
            }
        }
        assert!(written <= (BURST + PER_SECOND) as u64 + 1, "{written}");
        // Another kind still gets through at once.
        let other = limit.check("closing 127.0.0.1:1: bad Fetch request header: x", start);
        assert!(matches!(other, Verdict::Write { suppressed: 0, .. }));
        // The lines let through tell, together, how many were dropped.
        let later = start + Duration::from_secs(5);
        match limit.check("closing 127.0.0.1:2: unknown API key 1", later) {
            Verdict::Write { suppressed, kind } => {
                assert_eq!(told + suppressed, 3_000 - written);
                assert_eq!(kind, "unknown API key");
            }
            Verdict::Drop => panic!("dropped after the refill"),
        }
    }

    #[test]
    fn kinds_beyond_the_cap_share_one_bucket() {
        let limit = LogLimit::default();
        let now = Instant::now();
        for i in 0..MAX_KINDS {
            let _ = limit.check(
                &format!(
                    "kind{} x",
                    char::from(b'a' + (i % 26) as u8).to_string().repeat(i + 1)
                ),
                now,
            );
        }
        let mut written = 0;
        for i in 0..1_000 {
            if limit.check(&format!("fresh kind {}", "z".repeat(i % 40 + 1)), now) != Verdict::Drop
            {
                written += 1;
            }
        }
        assert!(written <= BURST as usize, "{written}");
    }
}
