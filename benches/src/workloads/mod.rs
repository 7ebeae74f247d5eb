//! The workloads the load tool runs, and the one contract they share: [`Workload`].
//!
//! A workload is a fixed recipe of work and inputs plus the figures it reports; an
//! implementation is one timer or purgatory that the recipe is run against. Each
//! workload module declares its implementations as a [`clap::ValueEnum`], its
//! parameters and its result, and maps an implementation to the code that runs it with
//! one `match`. The load tool's parent process (`crate::cli`) knows workloads only
//! through this trait.
//!
//! | workload | module | what it measures |
//! |---|---|---|
//! | W1 | [`w1`] | add and cancel cost and memory of a timer whose clock stands still |
//! | W2 | [`w2`] | how late timers fire on the real clock |
//! | W3 | [`w3`] | a purgatory under a stream of requests that complete or expire |
//!
//! # Invariants
//! - An implementation's name is its `ValueEnum` name, and the enum is the only list of
//!   a workload's implementations: the command line, a child job and a result use that
//!   name, and a name that is not in the enum is refused before anything runs.
//! - [`Workload::run`] runs one implementation once in the calling process. Its result
//!   serialises to one JSON object whose numeric fields are the figures.
//! - [`Measurement`] is the only place that lists every workload; its JSON form is the
//!   job the parent hands a child process (`{"W1":{"implementation":..,"params":..}}`).

pub mod w1;
pub mod w2;
pub mod w3;

use std::collections::BTreeMap;
use std::fmt::Debug;

use clap::ValueEnum;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::harness::child::run_in_child;
use crate::report::statistics::Spread;
use crate::report::Figure;

/// What the load tool needs of a workload.
pub trait Workload: Sized + 'static {
    /// The subcommand's name, also the `workload` field of the JSON summary (`w1`).
    const NAME: &'static str;
    /// The implementations run when `--impl` is not given, in the order of the table.
    const DEFAULT_IMPLEMENTATIONS: &'static [Self::Implementation];
    /// Global allocator of the measurement processes when `--allocator` is not given.
    const DEFAULT_ALLOCATOR: &'static str;
    /// The table's rows.
    const FIGURES: &'static [Figure];
    /// Whether the parent shows its spinner while a child measures; false where the
    /// child draws a progress line of its own.
    const PARENT_SPINNER: bool = true;

    /// The implementations this workload can run.
    type Implementation: ValueEnum + Copy + Eq + Debug + 'static;
    /// What one run needs besides the implementation.
    type Params: Clone + Debug + Serialize + DeserializeOwned;
    /// What one run reports.
    type Result: Serialize;

    /// The table's title line.
    fn title(params: &Self::Params) -> String;

    /// Runs `implementation` once, in this process.
    fn run(
        implementation: Self::Implementation,
        params: &Self::Params,
    ) -> Result<Self::Result, String>;

    /// Puts a job of this workload into the list of every workload's jobs.
    fn measurement(job: Job<Self>) -> Measurement;

    /// A second configuration that every implementation is also measured with, and the
    /// spinner's label for it; the main runs are then related to it by
    /// [`Workload::relate_to_baseline`]. None by default.
    fn baseline(_params: &Self::Params) -> Option<(&'static str, Self::Params)> {
        None
    }

    /// Adds to one main run's result the figures that relate it to the same
    /// implementation's baseline runs (their medians and spreads). Nothing by default.
    fn relate_to_baseline(_run: &mut Value, _baseline: &BTreeMap<String, Spread>) {}
}

/// The name of an implementation, as the command line spells it.
pub fn implementation_name<I: ValueEnum>(implementation: &I) -> String {
    implementation
        .to_possible_value()
        .map_or_else(String::new, |v| v.get_name().to_owned())
}

/// One measurement: an implementation of workload `W` and the parameters to run it with.
#[derive(Serialize, Deserialize)]
#[serde(bound = "")]
pub struct Job<W: Workload> {
    /// Which implementation (serialised by name).
    #[serde(with = "by_name")]
    pub implementation: W::Implementation,
    /// The parameters.
    pub params: W::Params,
}

impl<W: Workload> Job<W> {
    /// Runs the job in this process and returns its result as JSON.
    pub fn run_here(&self) -> Result<Value, String> {
        let result = W::run(self.implementation, &self.params)?;
        serde_json::to_value(&result).map_err(|e| e.to_string())
    }

    /// Runs the job in a fresh child process with global allocator `allocator`.
    pub fn run_in_child(self, allocator: &str) -> Result<Value, String> {
        run_in_child(&W::measurement(self), allocator)
    }
}

/// A job of any workload: what the parent sends a child process.
#[derive(Serialize, Deserialize)]
pub enum Measurement {
    /// W1 (or W1-mt).
    W1(Job<w1::TimerChurn>),
    /// W2.
    W2(Job<w2::TimerExpiry>),
    /// W3 (or W3-events).
    W3(Job<w3::PurgatoryLoad>),
}

impl Measurement {
    /// Runs the job in this process and returns its result as JSON.
    pub fn run_here(&self) -> Result<Value, String> {
        match self {
            Measurement::W1(job) => job.run_here(),
            Measurement::W2(job) => job.run_here(),
            Measurement::W3(job) => job.run_here(),
        }
    }
}

/// Serialises an implementation as its command-line name.
mod by_name {
    use clap::ValueEnum;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<I: ValueEnum, S: Serializer>(value: &I, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::implementation_name(value))
    }

    pub fn deserialize<'de, I: ValueEnum, D: Deserializer<'de>>(d: D) -> Result<I, D::Error> {
        let name = String::deserialize(d)?;
        I::from_str(&name, false)
            .map_err(|_| serde::de::Error::custom(format!("unknown implementation `{name}`")))
    }
}
