//! The search for the highest rate held, as a state machine that is told each attempt's
//! outcome, so that several searches (implementations, criteria) can step in turn.
//!
//! Starting at a rate, the target doubles while it is held (or, if the starting rate is
//! not held, halves until one is), then the gap between the last rate held and the first
//! one missed is bisected [`BISECT_STEPS`] times. "Held" and "not held" below are a rate's
//! decision, however it is made: `--find-max` decides each rate by a majority of
//! attempts ([`crate::cli::majority_search`]), one attempt with `--attempts 1`.
//!
//! | phase | next rate | held | not held |
//! |---|---|---|---|
//! | `Start` | the start | `Doubling` (`Done` past [`MAX_RATE`]) | `Halving` (`Done` below [`MIN_RATE`]) |
//! | `Doubling` | twice the last held | again (`Done` past [`MAX_RATE`]) | `Bisecting` |
//! | `Halving` | half the last missed | `Bisecting` (`Done` if the missed one is past [`MAX_RATE`]) | again (`Done` below [`MIN_RATE`]) |
//! | `Bisecting(n)` | the gap's middle | `Bisecting(n - 1)`, `Done` at 0 | same |
//! | `Done` | none | | |
//!
//! # Invariants
//! - `held` is the highest rate held so far (0 if none) and `missed` the lowest missed
//!   above it; rates are rounded to whole requests/s after the start.
//! - The same outcomes give the same rates: a search can be replayed from recorded
//!   attempts.

/// Bisection steps after the doubling or halving phase.
pub const BISECT_STEPS: u32 = 4;
/// The highest target rate tried, requests/s.
pub const MAX_RATE: f64 = 64e6;
/// The lowest target rate tried, requests/s.
pub const MIN_RATE: f64 = 1e3;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Phase {
    Start,
    Doubling,
    Halving,
    Bisecting(u32),
    Done,
}

/// One search for the highest rate held.
#[derive(Clone, Debug)]
pub struct RateSearch {
    start: f64,
    held: f64,
    missed: f64,
    phase: Phase,
}

impl RateSearch {
    /// A search starting at `start` requests/s.
    pub fn new(start: f64) -> Self {
        RateSearch {
            start,
            held: 0.0,
            missed: start,
            phase: Phase::Start,
        }
    }

    /// The rate to try next, or `None` once the search is over.
    pub fn next_rate(&self) -> Option<f64> {
        match self.phase {
            Phase::Start => Some(self.start),
            Phase::Doubling => Some(self.held * 2.0),
            Phase::Halving => Some((self.missed / 2.0).round()),
            Phase::Bisecting(_) => Some(((self.held + self.missed) / 2.0).round()),
            Phase::Done => None,
        }
    }

    /// Records whether `rate` (the last [`RateSearch::next_rate`]) was held.
    pub fn record(&mut self, rate: f64, held: bool) {
        if held {
            self.held = rate;
        } else {
            self.missed = rate;
        }
        self.phase = match (self.phase, held) {
            (Phase::Start | Phase::Doubling, true) if rate * 2.0 > MAX_RATE => {
                self.missed = rate * 2.0;
                Phase::Done
            }
            (Phase::Start | Phase::Doubling, true) => Phase::Doubling,
            (Phase::Doubling, false) => Phase::Bisecting(BISECT_STEPS),
            (Phase::Start | Phase::Halving, false) if rate / 2.0 < MIN_RATE => Phase::Done,
            (Phase::Start | Phase::Halving, false) => Phase::Halving,
            (Phase::Halving, true) if self.missed > MAX_RATE => Phase::Done,
            (Phase::Halving, true) => Phase::Bisecting(BISECT_STEPS),
            (Phase::Bisecting(n), _) if n > 1 => Phase::Bisecting(n - 1),
            (Phase::Bisecting(_) | Phase::Done, _) => Phase::Done,
        };
    }

    /// The highest rate held (0 if none) and the lowest rate missed above it (twice the
    /// rate held when doubling passed [`MAX_RATE`]).
    pub fn outcome(&self) -> (f64, f64) {
        (self.held, self.missed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a search against a machine that holds every rate up to `limit`.
    fn search(start: f64, limit: f64) -> (Vec<f64>, (f64, f64)) {
        let mut s = RateSearch::new(start);
        let mut tried = Vec::new();
        while let Some(rate) = s.next_rate() {
            tried.push(rate);
            s.record(rate, rate <= limit);
        }
        (tried, s.outcome())
    }

    #[test]
    fn doubles_then_bisects() {
        let (tried, outcome) = search(1e6, 3.3e6);
        assert_eq!(tried, [1e6, 2e6, 4e6, 3e6, 3.5e6, 3.25e6, 3.375e6]);
        assert_eq!(outcome, (3.25e6, 3.375e6));
    }

    #[test]
    fn halves_then_bisects() {
        let (tried, outcome) = search(4e6, 1.2e6);
        assert_eq!(tried, [4e6, 2e6, 1e6, 1.5e6, 1.25e6, 1.125e6, 1.1875e6]);
        assert_eq!(outcome, (1.1875e6, 1.25e6));
    }

    #[test]
    fn stops_at_the_bounds() {
        let (tried, outcome) = search(16e6, f64::INFINITY);
        assert_eq!(tried, [16e6, 32e6, 64e6]);
        assert_eq!(outcome, (64e6, 128e6));
        let (tried, outcome) = search(4e3, 0.0);
        assert_eq!(tried, [4e3, 2e3, 1e3]);
        assert_eq!(outcome, (0.0, 1e3));
    }
}
