//! The span current at a watch is entered around that operation's callbacks and drop on
//! every path (`purgatory/src/span.rs`): each operation logs from `on_complete`,
//! `on_expiration` and its drop, and a small subscriber of this file records the span
//! each event saw as current, on whatever thread it ran. Also: a callback that panics
//! leaves no span entered, every reference the purgatory took is closed, and a subscriber
//! that panics in any span step loses that step only.
//!
//! The subscriber is global (the reaper's events must reach it), so the tests of this
//! binary share it: each test uses its own request numbers, and looks only at those.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use purgatory::{
    Completion, DelayedOperation, ManualClock, OperationHandle, Purgatory, PurgatoryBuilder,
    TimerBuilder, WatchOutcome,
};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};
use tracing_core::span::Current;

const PATIENCE: Duration = Duration::from_secs(20);

// ---- the subscriber ----

/// One event of target `spans` (an operation's) or `purgatory` at level error (a panic
/// report), with the request of the span current when it was logged.
#[derive(Clone, Debug)]
struct Seen {
    op: Option<u64>,
    step: String,
    span: Option<u64>,
    thread: String,
}

/// A span: its `req` field, and how many handles of it are open.
struct SpanData {
    meta: &'static Metadata<'static>,
    req: Option<u64>,
    refs: u64,
}

/// A span step the subscriber can be told to panic at, once, for one request's span.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Current,
    Clone,
    Enter,
    Exit,
    Close,
}

#[derive(Default)]
struct Recorder {
    next: AtomicU64,
    spans: Mutex<HashMap<u64, SpanData>>,
    events: Mutex<Vec<Seen>>,
    panic_at: Mutex<Option<(Step, u64)>>,
}

thread_local! {
    /// The spans this thread is in, innermost last.
    static STACK: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Recorder {
    fn req(&self, id: u64) -> Option<u64> {
        lock(&self.spans).get(&id).and_then(|span| span.req)
    }

    /// Panics if told to at `step` for the span `id` (no lock held, the stack released).
    fn maybe_panic(&self, step: Step, id: u64) {
        let Some(req) = self.req(id) else { return };
        let mut armed = lock(&self.panic_at);
        if *armed == Some((step, req)) {
            *armed = None;
            drop(armed);
            panic!("the subscriber panics at {step:?} of request {req}");
        }
    }
}

#[derive(Default)]
struct Fields {
    req: Option<u64>,
    op: Option<u64>,
    step: Option<String>,
}

impl Visit for Fields {
    fn record_u64(&mut self, field: &Field, value: u64) {
        match field.name() {
            "req" => self.req = Some(value),
            "op" => self.op = Some(value),
            _ => {}
        }
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "step" {
            self.step = Some(value.to_owned());
        }
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" && self.step.is_none() {
            self.step = Some(format!("{value:?}"));
        }
    }
}

struct Global(&'static Recorder);

impl Subscriber for Global {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, attributes: &Attributes<'_>) -> Id {
        let mut fields = Fields::default();
        attributes.record(&mut fields);
        let id = self.0.next.fetch_add(1, Ordering::Relaxed) + 1;
        let data = SpanData {
            meta: attributes.metadata(),
            req: fields.req,
            refs: 1,
        };
        lock(&self.0.spans).insert(id, data);
        Id::from_u64(id)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let meta = event.metadata();
        let ours = meta.target() == "spans";
        let report = meta.target() == "purgatory" && *meta.level() == tracing::Level::ERROR;
        if !ours && !report {
            return;
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        let current = STACK.with(|stack| stack.borrow().last().copied());
        let seen = Seen {
            op: fields.op,
            step: fields.step.unwrap_or_default(),
            span: current.and_then(|id| self.0.req(id)),
            thread: std::thread::current().name().unwrap_or("").to_owned(),
        };
        lock(&self.0.events).push(seen);
    }
    fn enter(&self, id: &Id) {
        self.0.maybe_panic(Step::Enter, id.into_u64());
        STACK.with(|stack| stack.borrow_mut().push(id.into_u64()));
    }
    fn exit(&self, id: &Id) {
        STACK.with(|stack| {
            let mut stack = stack.borrow_mut();
            if let Some(at) = stack.iter().rposition(|&entered| entered == id.into_u64()) {
                stack.remove(at);
            }
        });
        self.0.maybe_panic(Step::Exit, id.into_u64());
    }
    fn current_span(&self) -> Current {
        let Some(id) = STACK.with(|stack| stack.borrow().last().copied()) else {
            return Current::none();
        };
        self.0.maybe_panic(Step::Current, id);
        let meta = lock(&self.0.spans).get(&id).map(|span| span.meta);
        meta.map_or_else(Current::none, |meta| Current::new(Id::from_u64(id), meta))
    }
    fn clone_span(&self, id: &Id) -> Id {
        if let Some(span) = lock(&self.0.spans).get_mut(&id.into_u64()) {
            span.refs += 1;
        }
        self.0.maybe_panic(Step::Clone, id.into_u64());
        id.clone()
    }
    fn try_close(&self, id: Id) -> bool {
        let closed = match lock(&self.0.spans).get_mut(&id.into_u64()) {
            Some(span) => {
                span.refs -= 1;
                span.refs == 0
            }
            None => false,
        };
        self.0.maybe_panic(Step::Close, id.into_u64());
        closed
    }
}

fn recorder() -> &'static Recorder {
    static RECORDER: OnceLock<&'static Recorder> = OnceLock::new();
    RECORDER.get_or_init(|| {
        let recorder: &'static Recorder = Box::leak(Box::default());
        tracing::subscriber::set_global_default(Global(recorder)).expect("the only subscriber");
        recorder
    })
}

/// The span of request `req` (entered by the caller while it watches).
fn request(req: u64) -> tracing::Span {
    recorder();
    tracing::info_span!("request", req)
}

/// What operation `op` logged.
fn seen(op: u64) -> Vec<Seen> {
    lock(&recorder().events)
        .iter()
        .filter(|seen| seen.op == Some(op))
        .cloned()
        .collect()
}

/// The panic reports the purgatory logged in request `req`'s span.
fn reports_in(req: u64) -> usize {
    lock(&recorder().events)
        .iter()
        .filter(|seen| seen.op.is_none() && seen.span == Some(req))
        .count()
}

/// The open handles of request `req`'s spans.
fn open_refs(req: u64) -> u64 {
    lock(&recorder().spans)
        .values()
        .filter(|span| span.req == Some(req))
        .map(|span| span.refs)
        .sum()
}

/// The spans this thread is in, by request.
fn stack() -> Vec<Option<u64>> {
    let ids = STACK.with(|stack| stack.borrow().clone());
    ids.into_iter().map(|id| recorder().req(id)).collect()
}

/// Asserts that operation `op` logged exactly `steps`, once each, every one in request
/// `req`'s span; returns the threads they ran on.
#[track_caller]
fn assert_in_span(op: u64, req: Option<u64>, steps: &[&str]) -> Vec<String> {
    let seen = seen(op);
    let mut logged: Vec<&str> = seen.iter().map(|s| s.step.as_str()).collect();
    logged.sort_unstable();
    let mut expected = steps.to_vec();
    expected.sort_unstable();
    assert_eq!(logged, expected, "op {op}: {seen:?}");
    for s in &seen {
        assert_eq!(s.span, req, "op {op}, {}: on {}", s.step, s.thread);
    }
    seen.into_iter().map(|s| s.thread).collect()
}

// ---- the operation ----

/// Logs from each callback and its drop; ready when its flag says so.
struct Logs {
    op: u64,
    timeout: Duration,
    ready: Arc<AtomicBool>,
    panics: bool,
    /// How long `on_complete` sleeps (to hold up the reaper).
    sleep: Duration,
}

impl Logs {
    fn new(op: u64, timeout: Duration) -> Self {
        Logs {
            op,
            timeout,
            ready: Arc::new(AtomicBool::new(false)),
            panics: false,
            sleep: Duration::ZERO,
        }
    }
}

impl DelayedOperation for Logs {
    fn timeout(&self) -> Duration {
        self.timeout
    }
    fn try_complete(&mut self) -> bool {
        self.ready.load(Ordering::Acquire)
    }
    fn on_complete(&mut self, _how: Completion) {
        std::thread::sleep(self.sleep);
        tracing::info!(target: "spans", op = self.op, step = "complete");
        assert!(!self.panics, "on_complete of op {} panics", self.op);
    }
    fn on_expiration(&mut self) {
        tracing::info!(target: "spans", op = self.op, step = "expire");
    }
}

impl Drop for Logs {
    fn drop(&mut self) {
        tracing::info!(target: "spans", op = self.op, step = "drop");
    }
}

const LONG: Duration = Duration::from_secs(600);

fn manual(name: &str) -> (Purgatory<u64, Logs>, ManualClock) {
    let clock = ManualClock::new();
    let purgatory = PurgatoryBuilder::new()
        .name(name)
        .timer(TimerBuilder::new().clock(clock.clone()).reaper(false))
        .build()
        .unwrap();
    (purgatory, clock)
}

/// Watches `op` on `keys` inside request `req`'s span (the caller's span is left as it
/// was); its handle if it waits.
fn watch_in(
    purgatory: &Purgatory<u64, Logs>,
    req: u64,
    op: Logs,
    keys: &[u64],
) -> Option<OperationHandle<Logs>> {
    let span = request(req);
    let _in = span.enter();
    match purgatory.watch(op, keys.iter().copied()).unwrap() {
        WatchOutcome::Pending(handle) => Some(handle),
        WatchOutcome::Completed => None,
    }
}

fn wait_until(what: &str, done: impl Fn() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < PATIENCE, "waited too long for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

// ---- the paths ----

#[test]
fn a_watch_that_completes_at_once_answers_in_its_span() {
    let (p, _clock) = manual("spans-at-once");
    let op = Logs::new(100, LONG);
    op.ready.store(true, Ordering::Release);
    assert!(watch_in(&p, 100, op, &[1]).is_none(), "completed");
    assert_in_span(100, Some(100), &["complete", "drop"]);
    assert_eq!(open_refs(100), 0, "every handle closed");
}

#[test]
fn an_event_from_another_thread_in_another_span_answers_in_the_watch_s_span() {
    let (p, _clock) = manual("spans-event");
    let op = Logs::new(200, LONG);
    let ready = Arc::clone(&op.ready);
    watch_in(&p, 200, op, &[2]);
    std::thread::scope(|s| {
        s.spawn(|| {
            let event = request(299);
            let _in = event.enter();
            ready.store(true, Ordering::Release);
            assert_eq!(p.check_and_complete(&2), 1);
            assert_eq!(stack(), [Some(299)], "back in its own span only");
        });
    });
    assert_in_span(200, Some(200), &["complete", "drop"]);
    assert_eq!(open_refs(200), 0);
}

#[test]
fn a_force_answers_in_the_watch_s_span() {
    let (p, _clock) = manual("spans-force");
    let handle = watch_in(&p, 300, Logs::new(300, LONG), &[3]).expect("waiting");
    std::thread::spawn(move || {
        let _in = request(399).entered();
        assert!(p.force_complete(&handle));
        assert_eq!(stack(), [Some(399)]);
    })
    .join()
    .unwrap();
    assert_in_span(300, Some(300), &["complete", "drop"]);
    assert_eq!(open_refs(300), 0);
}

#[test]
fn a_timeout_on_the_reaper_answers_in_the_watch_s_span_and_leaves_it() {
    let p: Purgatory<u64, Logs> = Purgatory::new("spans-reaper");
    watch_in(&p, 400, Logs::new(400, Duration::from_millis(5)), &[4]);
    wait_until("op 400's expiry", || seen(400).len() == 3);
    // Watched in no span: the reaper, done with op 400, is back in none.
    assert!(p
        .watch(Logs::new(401, Duration::from_millis(5)), [4])
        .is_ok());
    wait_until("op 401's expiry", || seen(401).len() == 3);
    let threads = assert_in_span(400, Some(400), &["complete", "expire", "drop"]);
    assert!(
        threads.iter().all(|t| t == "spans-reaper-reaper"),
        "{threads:?}"
    );
    assert_in_span(401, None, &["complete", "expire", "drop"]);
    assert_eq!(open_refs(400), 0);
}

#[test]
fn a_stand_in_answers_in_the_watch_s_span() {
    let p: Purgatory<u64, Logs> = Purgatory::new("spans-stand-in");
    // Op 500 holds up the reaper in its on_complete; op 501, due meanwhile, is expired
    // by a stand-in thread.
    let mut slow = Logs::new(500, Duration::from_millis(5));
    slow.sleep = Duration::from_millis(300);
    watch_in(&p, 500, slow, &[5]);
    watch_in(&p, 501, Logs::new(501, Duration::from_millis(40)), &[5]);
    wait_until("both expiries", || {
        seen(500).len() == 3 && seen(501).len() == 3
    });
    assert_in_span(500, Some(500), &["complete", "expire", "drop"]);
    let threads = assert_in_span(501, Some(501), &["complete", "expire", "drop"]);
    assert!(
        threads.iter().all(|t| t.contains("stand-in")),
        "expired by a stand-in: {threads:?}"
    );
}

#[test]
fn a_pool_answers_in_the_watch_s_span() {
    let p: Purgatory<u64, Logs> = PurgatoryBuilder::new()
        .name("spans-pool")
        .timer(TimerBuilder::new().executor(purgatory::Executor::pool(1).unwrap()))
        .build()
        .unwrap();
    watch_in(&p, 600, Logs::new(600, Duration::from_millis(5)), &[6]);
    wait_until("op 600's expiry", || seen(600).len() == 3);
    assert_in_span(600, Some(600), &["complete", "expire", "drop"]);
    assert_eq!(open_refs(600), 0);
}

#[test]
fn shutdown_and_the_last_drop_answer_in_each_watch_s_span() {
    let (p, _clock) = manual("spans-shutdown");
    watch_in(&p, 700, Logs::new(700, LONG), &[7]);
    watch_in(&p, 701, Logs::new(701, LONG), &[7]);
    {
        let _in = request(799).entered();
        p.shutdown();
        assert_eq!(stack(), [Some(799)]);
    }
    assert_in_span(700, Some(700), &["complete", "expire", "drop"]);
    assert_in_span(701, Some(701), &["complete", "expire", "drop"]);

    let (p, _clock) = manual("spans-last-drop");
    watch_in(&p, 710, Logs::new(710, LONG), &[7]);
    drop(p);
    assert_in_span(710, Some(710), &["complete", "expire", "drop"]);
    for req in [700, 701, 710] {
        assert_eq!(open_refs(req), 0, "request {req}");
    }
}

#[test]
fn a_batch_carries_the_span_of_its_call_to_each_operation() {
    let (p, clock) = manual("spans-batch");
    let ops = (800..840).map(|op| (Logs::new(op, Duration::from_millis(1)), [8]));
    {
        let _in = request(800).entered();
        assert!(p.watch_batch(ops).iter().all(Result::is_ok));
    }
    clock.advance(Duration::from_millis(5));
    p.advance_clock(Duration::ZERO);
    for op in 800..840 {
        assert_in_span(op, Some(800), &["complete", "expire", "drop"]);
    }
    assert_eq!(open_refs(800), 0);
}

/// A key whose `Hash` panics for 0: its operation is refused by a chunk after it had a
/// slot (and so a handle of the span).
#[derive(Clone, PartialEq, Eq)]
struct HashBomb(u64);

impl std::hash::Hash for HashBomb {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        assert!(self.0 != 0, "Hash of key 0 panics (on purpose)");
        self.0.hash(state);
    }
}

/// A chunk's members each close the handle of the span they took, whichever way they go:
/// refused at admission (no keys: no handle taken), refused at listing (a key's `Hash`
/// panicked, after its slot was taken: closed once no slot is held), completed at the
/// chunk's try, or expired later.
#[test]
fn a_chunk_closes_the_span_of_each_member_refused_completed_or_expired() {
    let clock = ManualClock::new();
    let p: Purgatory<HashBomb, Logs> = PurgatoryBuilder::new()
        .name("spans-batch-refused")
        .timer(TimerBuilder::new().clock(clock.clone()).reaper(false))
        .build()
        .unwrap();
    let ops = (1300..1340).map(|op| {
        let logs = Logs::new(op, Duration::from_millis(1));
        if op == 1320 {
            logs.ready.store(true, Ordering::Release);
        }
        let keys = match op {
            1310 => vec![HashBomb(11), HashBomb(0)],
            1330 => vec![],
            _ => vec![HashBomb(11)],
        };
        (logs, keys)
    });
    let results = {
        let _in = request(1300).entered();
        p.watch_batch(ops)
    };
    let mut refused = Vec::new();
    for (op, result) in (1300..1340).zip(results) {
        match (op, result) {
            (1310, Err(purgatory::WatchError::KeyPanicked(logs)))
            | (1330, Err(purgatory::WatchError::NoKeys(logs))) => refused.push(logs),
            (1320, Ok(WatchOutcome::Completed)) | (_, Ok(WatchOutcome::Pending(_))) => {}
            (op, other) => panic!("operation {op}: {:?}", other.map(|_| ())),
        }
    }
    assert_eq!(refused.len(), 2);
    assert_in_span(1320, Some(1300), &["complete", "drop"]);
    clock.advance(Duration::from_millis(5));
    p.advance_clock(Duration::ZERO);
    for op in (1300..1340).filter(|op| ![1310, 1320, 1330].contains(op)) {
        assert_in_span(op, Some(1300), &["complete", "expire", "drop"]);
    }
    assert_eq!(
        open_refs(1300),
        0,
        "a refused member's handle of the span left open"
    );
    drop(refused);
    assert_in_span(1310, None, &["drop"]);
    assert_in_span(1330, None, &["drop"]);
}

#[test]
fn a_cancel_closes_the_span_and_a_guard_drops_the_operation_in_it() {
    let (p, _clock) = manual("spans-cancel");
    let handle = watch_in(&p, 900, Logs::new(900, LONG), &[9]).expect("waiting");
    let op = p.cancel(&handle).expect("waiting");
    assert_eq!(open_refs(900), 0, "closed when handed back");
    drop(op);
    assert_in_span(900, None, &["drop"]);

    let handle = watch_in(&p, 901, Logs::new(901, LONG), &[9]).expect("waiting");
    drop(p.cancel_on_drop(handle));
    assert_in_span(901, Some(901), &["drop"]);
    assert_eq!(open_refs(901), 0);
}

#[test]
fn a_callback_that_panics_is_reported_in_its_span_and_leaves_it() {
    let (p, _clock) = manual("spans-panic");
    let mut op = Logs::new(1000, LONG);
    op.panics = true;
    let ready = Arc::clone(&op.ready);
    watch_in(&p, 1000, op, &[10]);
    let _in = request(1099).entered();
    ready.store(true, Ordering::Release);
    assert_eq!(p.check_and_complete(&10), 1);
    assert_eq!(stack(), [Some(1099)], "the operation's span is left");
    assert_in_span(1000, Some(1000), &["complete", "drop"]);
    assert_eq!(reports_in(1000), 1, "the door's report carries the span");
    assert_eq!(p.stats().panicked, 1);
    assert_eq!(open_refs(1000), 0);
}

/// For each span step the subscriber takes: panicking there once loses that step only.
/// The operation is answered once, the caller sees no panic, the door counts one.
#[test]
fn a_subscriber_that_panics_at_a_span_step_loses_that_step_only() {
    for (k, step) in [
        Step::Current,
        Step::Clone,
        Step::Enter,
        Step::Exit,
        Step::Close,
    ]
    .into_iter()
    .enumerate()
    {
        let req = 1100 + k as u64;
        let (p, _clock) = manual("spans-subscriber-panics");
        let op = Logs::new(req, LONG);
        let ready = Arc::clone(&op.ready);
        let arm = || *lock(&recorder().panic_at) = Some((step, req));
        if matches!(step, Step::Current | Step::Clone) {
            arm(); // at the watch
        }
        watch_in(&p, req, op, &[11]);
        if !matches!(step, Step::Current | Step::Clone) {
            arm(); // at the answer
        }
        ready.store(true, Ordering::Release);
        assert_eq!(p.check_and_complete(&11), 1, "{step:?}");
        assert_eq!(
            *lock(&recorder().panic_at),
            None,
            "{step:?}: the subscriber panicked"
        );
        assert_eq!(p.stats().panicked, 1, "{step:?}");
        assert_eq!(stack(), [], "{step:?}: no span left entered");
        // Without a span carried, or not entered, the answer runs in the caller's (none).
        let answered_in = match step {
            Step::Current | Step::Clone | Step::Enter => None,
            Step::Exit | Step::Close => Some(req),
        };
        assert_in_span(req, answered_in, &["complete", "drop"]);
        // A clone that panicked still counted its handle, which the purgatory dropped
        // with the panic: the one handle this subscriber leaks.
        let leaked = u64::from(step == Step::Clone);
        assert_eq!(open_refs(req), leaked, "{step:?}");
    }
}

#[cfg(feature = "tokio")]
mod tokio_park {
    use super::*;
    use purgatory::Reply;
    use tracing::Instrument;

    /// Answers through its reply, and logs as `Logs` does.
    struct Parks {
        logs: Logs,
        reply: Reply<()>,
    }

    impl DelayedOperation for Parks {
        fn timeout(&self) -> Duration {
            self.logs.timeout
        }
        fn try_complete(&mut self) -> bool {
            self.logs.try_complete()
        }
        fn on_complete(&mut self, how: Completion) {
            self.logs.on_complete(how);
            self.reply.send(how, ());
        }
        fn on_expiration(&mut self) {
            self.logs.on_expiration();
        }
    }

    /// Until operation `op` has logged `n` events.
    async fn logged(op: u64, n: usize) {
        let start = Instant::now();
        while seen(op).len() < n {
            assert!(start.elapsed() < PATIENCE, "waited too long for op {op}");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_parked_operation_awaited_in_a_task_is_answered_in_the_task_s_span() {
        let p: Purgatory<u64, Parks> = Purgatory::new("spans-park");
        // Expired on the reaper.
        let expires = {
            let p = p.clone();
            async move {
                p.park_with([12], |reply| Parks {
                    logs: Logs::new(1200, Duration::from_millis(5)),
                    reply,
                })
                .map_err(|_| "refused")
                .unwrap()
                .await
            }
        };
        let answered = tokio::spawn(expires.instrument(request(1200)))
            .await
            .unwrap();
        assert_eq!(answered.unwrap().how, Completion::Expired);
        // Completed by an event from another task in another span.
        let logs = Logs::new(1201, LONG);
        let ready = Arc::clone(&logs.ready);
        let parked = {
            let p = p.clone();
            async move {
                p.park_with([12], |reply| Parks { logs, reply })
                    .map_err(|_| "refused")
                    .unwrap()
                    .await
            }
        };
        let parked = tokio::spawn(parked.instrument(request(1201)));
        let event = {
            let p = p.clone();
            async move {
                // Until the parked operation is watched.
                while p.stats().pending == 0 {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                ready.store(true, Ordering::Release);
                p.check_and_complete(&12)
            }
        };
        assert_eq!(
            tokio::spawn(event.instrument(request(1299))).await.unwrap(),
            1
        );
        assert_eq!(parked.await.unwrap().unwrap().how, Completion::Ready);
        // The answer is sent from `on_complete`: the rest may still be running.
        logged(1200, 3).await;
        logged(1201, 2).await;
        assert_in_span(1200, Some(1200), &["complete", "expire", "drop"]);
        assert_in_span(1201, Some(1201), &["complete", "drop"]);
        // A parked future dropped unanswered drops its operation in the span too.
        let logs = Logs::new(1202, LONG);
        let dropped = {
            let _in = request(1202).entered();
            p.park_with([12], |reply| Parks { logs, reply })
                .map_err(|_| "refused")
                .unwrap()
        };
        drop(dropped);
        assert_in_span(1202, Some(1202), &["drop"]);
        for req in [1200, 1201, 1202] {
            assert_eq!(open_refs(req), 0, "request {req}");
        }
    }
}
