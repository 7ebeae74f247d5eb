//! A [`RateSearch`] that decides each rate it tries by a majority of up to `attempts`
//! attempts at that rate instead of by one, so that one lucky or unlucky attempt near
//! the knee does not move it.
//!
//! The search keeps no attempt itself: each time it is asked for the next attempt it is
//! shown whether each attempt made so far at its current rate passed its criterion, and
//! it records the rates those outcomes decide until one needs another attempt. With
//! `majority = attempts / 2 + 1`, at the rate the inner search tries next:
//!
//! | attempts shown there | what happens |
//! |---|---|
//! | at least `majority` passed | the rate is decided held: recorded in the inner search, its tally kept as the knee's; on to the next rate |
//! | at least `majority` did not pass | the rate is decided missed: recorded; on to the next rate |
//! | neither | the search asks for one more attempt at this rate |
//! | (inner search over) | the search is over: no attempt is asked for |
//!
//! # Invariants
//! - `attempts` is odd and at least 1: a rate is never tied, and at most `attempts`
//!   attempts decide it (with 3: two agreeing ones, or all three on a split).
//! - The search is a function of the outcomes it is shown: another search (another
//!   criterion) can be replayed over the same attempts; it reuses every attempt already
//!   made at a rate, its tally counts all of them, and it asks only for the attempts its
//!   own majority still needs.
//! - With `attempts` = 1 the rates tried, and the outcome, are exactly [`RateSearch`]'s
//!   with one attempt per rate.
//! - The knee's tally is that of the highest rate decided held (none while none is).

use crate::cli::rate_search::RateSearch;

/// How many of the attempts at a rate passed, and of how many.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tally {
    /// Attempts that passed the criterion.
    pub passed: usize,
    /// Attempts made at the rate.
    pub of: usize,
}

/// One search for the highest rate held, each rate decided by a majority of attempts.
#[derive(Clone, Debug)]
pub struct MajoritySearch {
    search: RateSearch,
    attempts: usize,
    knee: Option<Tally>,
}

impl MajoritySearch {
    /// A search starting at `start` requests/s that decides each rate by a majority of
    /// up to `attempts` attempts.
    ///
    /// # Panics
    /// If `attempts` is even or 0 (the command line refuses those first).
    pub fn new(start: f64, attempts: usize) -> Self {
        assert!(
            attempts % 2 == 1,
            "a majority needs an odd number of attempts, got {attempts}"
        );
        MajoritySearch {
            search: RateSearch::new(start),
            attempts,
            knee: None,
        }
    }

    /// The rate that needs one more attempt, or `None` once the search is over.
    /// `outcomes_at(rate)` says, for every attempt made so far at `rate`, whether it
    /// passed this search's criterion; the rates those outcomes decide are recorded on
    /// the way.
    pub fn next_attempt(&mut self, mut outcomes_at: impl FnMut(f64) -> Vec<bool>) -> Option<f64> {
        let majority = self.attempts / 2 + 1;
        while let Some(rate) = self.search.next_rate() {
            let outcomes = outcomes_at(rate);
            let passed = outcomes.iter().filter(|&&passed| passed).count();
            if passed >= majority {
                self.search.record(rate, true);
                self.knee = Some(Tally {
                    passed,
                    of: outcomes.len(),
                });
            } else if outcomes.len() - passed >= majority {
                self.search.record(rate, false);
            } else {
                return Some(rate);
            }
        }
        None
    }

    /// The highest rate decided held (0 if none) and the lowest rate decided missed
    /// above it, as [`RateSearch::outcome`].
    pub fn outcome(&self) -> (f64, f64) {
        self.search.outcome()
    }

    /// The tally of the highest rate decided held, if one was.
    pub fn knee_tally(&self) -> Option<Tally> {
        self.knee
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A search's history: every attempt, in order, as (rate, passed).
    type History = Vec<(f64, bool)>;

    fn outcomes(history: &History, rate: f64) -> Vec<bool> {
        history
            .iter()
            .filter(|(r, _)| *r == rate)
            .map(|&(_, passed)| passed)
            .collect()
    }

    /// Runs a search to its end against `machine(rate, k)`, the outcome of the `k`-th
    /// attempt (from 0) at `rate`, adding to `history`.
    fn run(
        search: &mut MajoritySearch,
        history: &mut History,
        machine: impl Fn(f64, usize) -> bool,
    ) {
        while let Some(rate) = search.next_attempt(|r| outcomes(history, r)) {
            let k = outcomes(history, rate).len();
            history.push((rate, machine(rate, k)));
        }
    }

    /// The rates of a history, in order.
    fn rates(history: &History) -> Vec<f64> {
        history.iter().map(|&(rate, _)| rate).collect()
    }

    #[test]
    fn agreeing_attempts_decide_a_rate_once_they_are_a_majority() {
        let mut s = MajoritySearch::new(1e6, 3);
        let mut history = History::new();
        run(&mut s, &mut history, |rate, _| rate <= 3.3e6);
        // Two attempts a rate, never a third: each pair agrees.
        assert_eq!(
            rates(&history),
            [
                1e6, 1e6, 2e6, 2e6, 4e6, 4e6, 3e6, 3e6, 3.5e6, 3.5e6, 3.25e6, 3.25e6, 3.375e6,
                3.375e6
            ]
        );
        assert_eq!(s.outcome(), (3.25e6, 3.375e6));
        assert_eq!(s.knee_tally(), Some(Tally { passed: 2, of: 2 }));
        // With 5, three agreeing ones.
        let mut s = MajoritySearch::new(4e3, 5);
        let mut history = History::new();
        run(&mut s, &mut history, |_, _| false);
        assert_eq!(rates(&history), [[4e3; 3], [2e3; 3], [1e3; 3]].concat());
        assert_eq!(s.outcome(), (0.0, 1e3));
        assert_eq!(s.knee_tally(), None);
    }

    #[test]
    fn a_split_takes_the_third_attempt_and_goes_with_the_majority() {
        // 2M: held, missed, held (held, 2 of 3); 4M: missed, held, missed (missed).
        let mut s = MajoritySearch::new(1e6, 3);
        let mut history = History::new();
        run(&mut s, &mut history, |rate, k| {
            if rate == 2e6 {
                k != 1
            } else if rate == 4e6 {
                k == 1
            } else {
                rate < 2.5e6
            }
        });
        assert_eq!(
            &rates(&history)[..8],
            [1e6, 1e6, 2e6, 2e6, 2e6, 4e6, 4e6, 4e6]
        );
        assert_eq!(history[8].0, 3e6, "bisects between the two decided rates");
        assert_eq!(s.outcome(), (2.375e6, 2.5e6));
        assert_eq!(s.knee_tally(), Some(Tally { passed: 2, of: 2 }));
        // A knee decided on a split says so.
        let mut s = MajoritySearch::new(1e6, 3);
        let mut history = History::new();
        run(&mut s, &mut history, |rate, k| {
            rate < 3.3e6 && !(rate == 3.25e6 && k == 0)
        });
        assert_eq!(s.outcome(), (3.25e6, 3.375e6));
        assert_eq!(s.knee_tally(), Some(Tally { passed: 2, of: 3 }));
    }

    #[test]
    fn one_attempt_a_rate_tries_what_the_single_search_tries() {
        for (start, limit) in [
            (1e6, 3.3e6),
            (4e6, 1.2e6),
            (16e6, f64::INFINITY),
            (4e3, 0.0),
        ] {
            let mut single = RateSearch::new(start);
            let mut tried = Vec::new();
            while let Some(rate) = single.next_rate() {
                tried.push(rate);
                single.record(rate, rate <= limit);
            }
            let mut s = MajoritySearch::new(start, 1);
            let mut history = History::new();
            run(&mut s, &mut history, |rate, _| rate <= limit);
            assert_eq!(rates(&history), tried, "start {start}, limit {limit}");
            assert_eq!(s.outcome(), single.outcome());
        }
    }

    #[test]
    fn a_replayed_search_reuses_every_attempt_and_adds_only_what_it_needs() {
        // Two criteria over one set of attempts: "strict" passes below 2.5M; "loose"
        // passes below 3.1M, except the first attempt at 3M.
        let (strict, loose) = (
            |rate: f64, _: usize| rate < 2.5e6,
            |rate: f64, k: usize| rate < 3.1e6 && !(rate == 3e6 && k == 0),
        );
        let mut attempts: Vec<(f64, usize)> = Vec::new();
        let outcomes_by = |attempts: &[(f64, usize)], rate: f64, c: &dyn Fn(f64, usize) -> bool| {
            attempts
                .iter()
                .filter(|(r, _)| *r == rate)
                .map(|&(r, k)| c(r, k))
                .collect::<Vec<_>>()
        };
        let mut first = MajoritySearch::new(1e6, 3);
        while let Some(rate) = first.next_attempt(|r| outcomes_by(&attempts, r, &strict)) {
            let k = attempts.iter().filter(|(r, _)| *r == rate).count();
            attempts.push((rate, k));
        }
        let made_by_first = attempts.len();
        let mut second = MajoritySearch::new(1e6, 3);
        while let Some(rate) = second.next_attempt(|r| outcomes_by(&attempts, r, &loose)) {
            let k = attempts.iter().filter(|(r, _)| *r == rate).count();
            attempts.push((rate, k));
        }
        let added: Vec<f64> = attempts[made_by_first..].iter().map(|a| a.0).collect();
        // The first search tried 1M, 2M, 4M and 3M twice each: the second one decides
        // 1M, 2M and 4M on those alone, adds one third attempt at 3M (its first attempt
        // there missed, its second held), then two at each rate the first never tried.
        assert_eq!(
            added,
            [3e6, 3.5e6, 3.5e6, 3.25e6, 3.25e6, 3.125e6, 3.125e6],
            "{attempts:?}"
        );
        assert_eq!(second.outcome(), (3e6, 3.125e6));
        // The knee, 3M, decided held on 2 of 3: every attempt there counted.
        assert_eq!(outcomes_by(&attempts, 3e6, &loose), [false, true, true]);
        assert_eq!(second.knee_tally(), Some(Tally { passed: 2, of: 3 }));
    }

    #[test]
    #[should_panic(expected = "odd number of attempts")]
    fn an_even_count_is_refused() {
        let _ = MajoritySearch::new(1e6, 2);
    }
}
