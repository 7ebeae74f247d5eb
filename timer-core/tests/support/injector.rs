//! The fault injector of the two crates' fault-injection suites (`timer-core/tests/faults.rs`
//! and `purgatory/tests/faults/`, which includes this file): every call the library makes
//! into a test's user code (keys, operations, tasks, clocks, recorder, subscriber, hooks)
//! passes [`point`], which counts it and, on the call chosen for this run, panics or
//! stalls there, after the user code did its work.
//!
//! One injector per process: the suite's runs happen one at a time (a lock serializes
//! them), and calls the test itself makes on its user types (dropping an operation handed
//! back, say) are not counted ([`quiet`]).
//!
//! A census run ([`Run::census`]) also records, for each call, the purgatory's or timer's
//! function that made it: the innermost frame of either crate in its backtrace outside
//! their doors (`user_code.rs`) and the helpers that only pass a call on. Those are the
//! call sites the suites report.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::SeqCst};
use std::sync::{Mutex, MutexGuard, Once};
use std::time::Duration;

/// A kind of user code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[allow(dead_code)] // Each suite uses its own kinds.
pub enum Kind {
    TaskRun,
    TaskDrop,
    WakeHook,
    ExpireTarget,
    KeyHash,
    KeyEq,
    KeyClone,
    KeyDrop,
    Timeout,
    TryComplete,
    OnComplete,
    OnExpiration,
    OperationDrop,
    Clock,
    Recorder,
    Subscriber,
}

/// What the chosen call does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    Panic,
    Stall(Duration),
}

/// The message every injected panic starts with (the panic hook keeps them quiet).
pub const INJECTED: &str = "injected fault";

static CALLS: AtomicU64 = AtomicU64::new(0);
/// The call (1-based) to fault; 0: none.
static FAULT_AT: AtomicU64 = AtomicU64::new(0);
/// 0: panic, else a stall of that many milliseconds.
static STALL_MS: AtomicU8 = AtomicU8::new(0);
/// The kind of the call the fault hit, and whether it was a panic that happened.
static HIT: Mutex<Option<(Kind, bool)>> = Mutex::new(None);
static CENSUS: AtomicBool = AtomicBool::new(false);
static SITES: Mutex<BTreeMap<(Kind, String), u64>> = Mutex::new(BTreeMap::new());
/// Serializes runs.
static RUNS: Mutex<()> = Mutex::new(());

thread_local! {
    static QUIET: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` (the test's own code) without counting the user code it runs.
pub fn quiet<R>(f: impl FnOnce() -> R) -> R {
    let before = QUIET.with(|q| q.replace(true));
    let result = f();
    QUIET.with(|q| q.set(before));
    result
}

/// One call into user code of kind `kind`, made by the library: counted, and faulted if
/// it is the chosen one. A call made while the thread unwinds is counted but never
/// panics (a second panic would abort the process).
pub fn point(kind: Kind) {
    if QUIET.with(Cell::get) {
        return;
    }
    let n = CALLS.fetch_add(1, SeqCst) + 1;
    if CENSUS.load(SeqCst) {
        record_site(kind);
    }
    if n != FAULT_AT.load(SeqCst) {
        return;
    }
    match STALL_MS.load(SeqCst) {
        0 if !std::thread::panicking() => {
            *HIT.lock().unwrap() = Some((kind, true));
            std::panic::panic_any(format!("{INJECTED} at call {n} ({kind:?})"));
        }
        0 => *HIT.lock().unwrap() = Some((kind, false)),
        ms => {
            *HIT.lock().unwrap() = Some((kind, false));
            std::thread::sleep(Duration::from_millis(u64::from(ms)));
        }
    }
}

/// The library function that made the call being recorded (see the module doc): the
/// innermost frame of either crate, skipping the doors and the helpers that only pass a
/// call on (hashing a key, finding it in a shard, reading the clock).
fn record_site(kind: Kind) {
    const PASS_ON: [&str; 5] = [
        "::user_code::",
        "timer_core::clock::",
        "timer_core::core::TimerCore::now_nanos",
        "purgatory::watchers::Watchers::hash",
        "purgatory::watchers::ShardState::find",
    ];
    let trace = std::backtrace::Backtrace::force_capture().to_string();
    let site = trace
        .lines()
        .filter_map(|line| {
            let (number, symbol) = line.trim_start().split_once(": ")?;
            number.parse::<u32>().ok()?;
            Some(symbol)
        })
        .map(normalize)
        .find(|symbol| {
            (symbol.starts_with("purgatory::") || symbol.starts_with("timer_core::"))
                && !PASS_ON.iter().any(|helper| symbol.contains(helper))
        })
        .unwrap_or_else(|| "(no library frame)".to_owned());
    *SITES.lock().unwrap().entry((kind, site)).or_default() += 1;
}

/// A symbol as a plain path, without closures and generic arguments:
/// `purgatory::watchers::Watchers::list_one`; an impl block's function is named after its
/// type (`<impl purgatory::state::State<K,O>>::admit` in `purgatory::watch` becomes
/// `purgatory::watch::State::admit`), a trait method after its type
/// (`<purgatory::guard::CancelOnDrop<K,O> as Drop>::drop` becomes
/// `purgatory::guard::CancelOnDrop::drop`).
fn normalize(symbol: &str) -> String {
    let symbol = symbol.replace("::{{closure}}", "");
    // `<A as B>::rest` -> `A::rest`; `prefix::<impl A>::rest` -> `prefix::A::rest`.
    let symbol = if let Some(inner) = symbol.strip_prefix('<') {
        match inner.find(" as ") {
            Some(at) => {
                let rest = &inner[at..];
                let close = rest.find(">::").map_or(rest.len(), |c| c + 1);
                format!("{}{}", &inner[..at], &rest[close..])
            }
            None => symbol.clone(),
        }
    } else if let Some(at) = symbol.find("<impl ") {
        let ty_start = at + "<impl ".len();
        let ty_end = symbol[ty_start..]
            .find(">::")
            .map_or(symbol.len(), |e| ty_start + e);
        let ty = strip_generics(&symbol[ty_start..ty_end]);
        let ty = ty.rsplit("::").next().unwrap_or(&ty).to_owned();
        let rest = symbol.get(ty_end + 1..).unwrap_or("");
        format!("{}{ty}{rest}", &symbol[..at])
    } else {
        symbol.clone()
    };
    strip_generics(&symbol)
}

fn strip_generics(symbol: &str) -> String {
    let mut out = String::new();
    let mut depth = 0;
    for c in symbol.chars() {
        match c {
            '<' => depth += 1,
            '>' => depth -= 1,
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    out
}

/// One run of a scenario, holding the injector: counts from zero, faults the chosen call.
pub struct Run {
    _serial: MutexGuard<'static, ()>,
}

impl Run {
    /// A run that faults call `at` (1-based) with `fault`.
    pub fn faulting(at: u64, fault: Fault) -> Self {
        let run = Run::begin();
        STALL_MS.store(
            match fault {
                Fault::Panic => 0,
                Fault::Stall(d) => u8::try_from(d.as_millis()).expect("a short stall").max(1),
            },
            SeqCst,
        );
        FAULT_AT.store(at, SeqCst);
        run
    }

    /// A run that faults nothing and records where each call came from.
    pub fn census() -> Self {
        let run = Run::begin();
        SITES.lock().unwrap().clear();
        CENSUS.store(true, SeqCst);
        run
    }

    fn begin() -> Self {
        quiet_injected_panics();
        let serial = RUNS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        CALLS.store(0, SeqCst);
        FAULT_AT.store(0, SeqCst);
        *HIT.lock().unwrap() = None;
        Run { _serial: serial }
    }

    /// Calls counted so far.
    pub fn calls(&self) -> u64 {
        CALLS.load(SeqCst)
    }

    /// The kind of the call the fault hit, and whether it panicked (`None`: the run made
    /// fewer calls than the one chosen).
    pub fn hit(&self) -> Option<(Kind, bool)> {
        *HIT.lock().unwrap()
    }

    /// The census: each (kind, call site) and how many calls it made.
    pub fn sites(&self) -> BTreeMap<(Kind, String), u64> {
        SITES.lock().unwrap().clone()
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        FAULT_AT.store(0, SeqCst);
        CENSUS.store(false, SeqCst);
    }
}

/// A tracing subscriber that wants every event of the two crates, each a fault point.
pub struct Subscriber;

impl tracing::Subscriber for Subscriber {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        metadata.target().starts_with("purgatory") || metadata.target().starts_with("timer_core")
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, _: &tracing::Event<'_>) {
        point(Kind::Subscriber);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// Runs `f`, a call into the library, catching a panic that reaches the caller: recorded
/// in `propagated` as `what`, its payload dropped without counting its drop.
pub fn call<R>(
    propagated: &mut Vec<&'static str>,
    what: &'static str,
    f: impl FnOnce() -> R,
) -> Option<R> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(value) => Some(value),
        Err(payload) => {
            propagated.push(what);
            quiet(|| drop(payload));
            None
        }
    }
}

/// Installs, once, a panic hook that keeps injected panics quiet (thousands of them, each
/// caught by the library) and reports every other panic as the default hook would.
fn quiet_injected_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let message = info
                .payload()
                .downcast_ref::<String>()
                .map(String::as_str)
                .unwrap_or("");
            // FAULTS_TRACE=1: every injected panic too, with where it came from.
            if !message.starts_with(INJECTED) || std::env::var_os("FAULTS_TRACE").is_some() {
                default(info);
            }
        }));
    });
}
