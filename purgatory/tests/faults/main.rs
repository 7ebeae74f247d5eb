//! Every call into user code is a fault point, tested the way SQLite tests allocation
//! failure: each scenario is run once to count the calls the purgatory (and its timer)
//! make into user code, then once per call with that call panicking, and once per call
//! with it stalling, checking the ledger after every run:
//! - every operation a watch accepted is answered exactly once, or handed back by a
//!   cancel; every refused one came back in the error; each is dropped exactly once, and
//!   the operation contract holds (`probe/mod.rs`);
//! - nothing is answered after `shutdown` returned (or the last handle's drop);
//! - no panic reaches a caller but where the door's table says so (a key the caller lends
//!   to `check_and_complete` or `cancel_for_key`), and no round lets one escape (a round
//!   here is what the reaper runs: `advance_clock` on the test thread), and an operation
//!   watched after the fault still expires on time;
//! - `stats()` equals the ledger (the caught panic counted in `panicked`), nothing is
//!   left pending or listed, and (feature `metrics`) the published figures equal
//!   `stats()` unless the fault was the recorder's own.
//!
//! The user code is this test's (`user_types.rs`): keys, operations, the clock, the
//! tracing subscriber and (feature `metrics`) the metrics recorder, every method a fault
//! point that counts the call and faults the chosen one after doing its work. A census run
//! records which library function made each call (`injector.rs`); the summary prints the
//! call sites, and the test fails if a kind of user code the door's table lists was never
//! called (a scenario no longer reaches it).
//!
//! `cargo test -p kafka-purgatory --test faults -- --nocapture` prints the summary; with
//! `FAULTS_FULL=1` every stall lasts 50 ms instead of 2 ms.

#[path = "../probe/mod.rs"]
mod probe;

#[path = "../../../timer-core/tests/support/injector.rs"]
mod injector;
mod scenarios;
mod user_types;
mod world;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use injector::{Fault, Kind, Run};
use world::Published;

/// Installs, once, this binary's tracing subscriber and metrics recorder (both faulty).
fn install_globals() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        tracing::subscriber::set_global_default(injector::Subscriber).expect("the only subscriber");
        #[cfg(feature = "metrics")]
        metrics::set_global_recorder(RECORDER.get_or_init(Default::default))
            .expect("the only recorder");
    });
}

#[cfg(feature = "metrics")]
static RECORDER: OnceLock<user_types::recorder::FaultyRecorder> = OnceLock::new();

#[cfg(feature = "metrics")]
static SNAPSHOTTER: std::sync::Mutex<Option<metrics_util::debugging::Snapshotter>> =
    std::sync::Mutex::new(None);

/// Before a run: a fresh recorder for it (feature `metrics`).
fn fresh_recorder() {
    #[cfg(feature = "metrics")]
    {
        let snapshotter = RECORDER.get().expect("installed").fresh();
        *SNAPSHOTTER.lock().unwrap() = Some(snapshotter);
    }
}

/// The totals published under the label `name` (feature `metrics`; `None` without).
fn published(name: &str) -> Option<Published> {
    #[cfg(feature = "metrics")]
    {
        use metrics_util::debugging::DebugValue;
        let mut found = Published::default();
        let snapshot = SNAPSHOTTER.lock().unwrap().as_ref()?.snapshot();
        for (key, _, _, value) in snapshot.into_vec() {
            let labelled = key
                .key()
                .labels()
                .any(|label| label.key() == "purgatory" && label.value() == name);
            let DebugValue::Counter(value) = value else {
                continue;
            };
            if !labelled {
                continue;
            }
            match key.key().name() {
                "purgatory_completed_total" => found.completed = value,
                "purgatory_forced_total" => found.forced = value,
                "purgatory_expired_total" => found.expired = value,
                "purgatory_shutdown_expired_total" => found.expired_at_shutdown = value,
                "purgatory_cancelled_total" => found.cancelled = value,
                "purgatory_panicked_total" => found.panicked = value,
                _ => {}
            }
        }
        Some(found)
    }
    #[cfg(not(feature = "metrics"))]
    {
        let _ = name;
        None
    }
}

/// The kinds of user code the scenarios must reach (a key's `Clone` is never called: the
/// purgatory never clones a key; the recorder only with the feature `metrics`).
fn kinds_to_reach() -> BTreeSet<Kind> {
    let mut kinds: BTreeSet<Kind> = [
        Kind::KeyHash,
        Kind::KeyEq,
        Kind::KeyDrop,
        Kind::Timeout,
        Kind::TryComplete,
        Kind::OnComplete,
        Kind::OnExpiration,
        Kind::OperationDrop,
        Kind::Clock,
        Kind::Subscriber,
    ]
    .into();
    if cfg!(feature = "metrics") {
        kinds.insert(Kind::Recorder);
    }
    kinds
}

#[test]
fn every_call_into_user_code_fails_in_turn_and_the_ledger_holds() {
    install_globals();
    let stall = if std::env::var_os("FAULTS_FULL").is_some() {
        Duration::from_millis(50)
    } else {
        Duration::from_millis(2)
    };
    let started = Instant::now();
    let mut sites: BTreeMap<(Kind, String), u64> = BTreeMap::new();
    let (mut calls, mut panics, mut stalls) = (0, 0, 0);
    for (scenario_name, scenario) in scenarios::ALL {
        let census = Run::census();
        fresh_recorder();
        let world = scenario(format!("faults-{scenario_name}-census"));
        let counted = census.calls();
        for (site, n) in census.sites() {
            *sites.entry(site).or_default() += n;
        }
        world.check_ledger(&census, published);
        drop(census);
        calls += counted;
        for at in 1..=counted {
            for fault in [Fault::Panic, Fault::Stall(stall)] {
                let run = Run::faulting(at, fault);
                fresh_recorder();
                let label = match fault {
                    Fault::Panic => "panic",
                    Fault::Stall(_) => "stall",
                };
                let world = scenario(format!("faults-{scenario_name}-{label}-{at}"));
                world.check_ledger(&run, published);
                match run.hit() {
                    Some((_, true)) => panics += 1,
                    Some((_, false)) if fault != Fault::Panic => stalls += 1,
                    _ => {}
                }
            }
        }
    }
    let kinds: BTreeSet<Kind> = sites.keys().map(|(kind, _)| *kind).collect();
    let places: BTreeSet<&String> = sites.keys().map(|(_, site)| site).collect();
    println!(
        "fault injection: {} scenarios, {calls} calls into user code from {} call sites \
         ({} kind and site pairs), {panics} panics and {stalls} stalls injected, {:.1} s",
        scenarios::ALL.len(),
        places.len(),
        sites.len(),
        started.elapsed().as_secs_f64()
    );
    for ((kind, site), n) in &sites {
        println!("  {kind:?} from {site}: {n}");
    }
    let missing: Vec<_> = kinds_to_reach().difference(&kinds).copied().collect();
    assert!(
        missing.is_empty(),
        "user code no scenario reaches: {missing:?}"
    );
    assert!(
        !kinds.contains(&Kind::KeyClone),
        "the purgatory clones keys now: add the call sites to user_code.rs's table"
    );
}
