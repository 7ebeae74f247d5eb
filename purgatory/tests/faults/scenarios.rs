//! The scenarios: fixed scripts of calls, each on a fresh purgatory, that between them
//! reach every place the purgatory calls user code. Each is run once for a census, then
//! once per call with that call faulted.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use purgatory::{Executor, ManualClock, Purgatory};

use super::user_types::{Faulty, Key};
use super::world::World;

pub type Scenario = fn(String) -> World;

/// Every scenario, by name.
pub const ALL: &[(&str, Scenario)] = &[
    ("watch", watch),
    ("batch", batch),
    ("keys", keys),
    ("hand-over", hand_over),
    ("pool", pool),
    ("inside", inside),
    ("last-drop", last_drop),
    ("group", group),
    #[cfg(feature = "tokio")]
    ("parked", parked),
];

const MS: Duration = Duration::from_millis(1);
const LONG: Duration = Duration::from_secs(60);

fn manual(name: String) -> World {
    World::new(name, |builder, timer| builder.timer(timer))
}

/// Single watches: ready at the first try, at the second, never; a refused one (no
/// keys); a key listed twice; keyless ones (ready at once, expired, forced); deadlines
/// reset (earlier, later, then forced, stale); an event; a force; cancels by handle and
/// by guard; an expiry; a purge; shutdown from outside; a watch after it.
fn watch(name: String) -> World {
    let mut w = manual(name);
    let a = w.op(LONG);
    let a_id = a.0.id;
    let a = w.watch(a, &[1, 2]);
    let b = w.op(LONG);
    w.ready_from(b.0.id, 2);
    w.watch(b, &[2]);
    let c = w.op(LONG);
    w.ready_from(c.0.id, 1);
    w.watch(c, &[3]);
    let d = w.op(LONG);
    w.watch(d, &[]);
    let e = w.op(LONG);
    w.watch(e, &[4, 4]);
    let f = w.op(MS);
    w.watch(f, &[5]);
    let k = w.op(LONG);
    w.ready_from(k.0.id, 1);
    w.watch_keyless(k);
    let k = w.op(MS);
    w.watch_keyless(k);
    let k = w.op(LONG);
    if let Some(k) = w.watch_keyless(k) {
        w.force(&[&k]);
    }
    // Deadlines moved: a long one brought in (it expires below), a short one pushed out
    // (answered at shutdown), one moved and then forced, a stale handle's.
    let r = w.op(LONG);
    if let Some(r) = w.watch(r, &[9]) {
        w.reset(&r, Duration::ZERO);
    }
    let r = w.op(MS);
    if let Some(r) = w.watch_keyless(r) {
        w.reset(&r, LONG);
    }
    let r = w.op(LONG);
    if let Some(r) = w.watch(r, &[9]) {
        w.reset(&r, MS);
        w.force(&[&r]);
        w.reset(&r, MS);
    }
    w.advance(MS);
    w.ready_from(a_id, 1);
    w.check(2);
    let g = w.op(LONG);
    if let Some(g) = w.watch(g, &[6]) {
        w.force(&[&g]);
    }
    let h = w.op(LONG);
    if let Some(h) = w.watch(h, &[6]) {
        w.cancel(&h);
    }
    let i = w.op(LONG);
    let i_id = i.0.id;
    if let Some(i) = w.watch(i, &[7]) {
        w.drop_guard(i, i_id);
    }
    w.check(1);
    w.check(4);
    let _ = a;
    w.purge();
    w.still_expiring();
    w.shutdown();
    let late = w.op(LONG);
    w.watch(late, &[8]);
    w
}

/// On a `TimerGroup` beside a neighbour member holding operations of its own: watches
/// (one ready at its second try, keyless ones), an event, a deadline moved in, a force, a
/// cancel, rounds of the shared timer that expire both members' operations, shutdown
/// (the group's), a watch after it.
fn group(name: String) -> World {
    let mut w = World::on_group(name);
    let a = w.op(LONG);
    let a_id = a.0.id;
    let _a = w.watch(a, &[1]);
    let b = w.op(LONG);
    w.ready_from(b.0.id, 2);
    w.watch(b, &[2]);
    let k = w.op(MS);
    w.watch_keyless(k);
    let r = w.op(LONG);
    if let Some(r) = w.watch(r, &[3]) {
        w.reset(&r, Duration::ZERO);
    }
    let f = w.op(LONG);
    if let Some(f) = w.watch(f, &[4]) {
        w.force(&[&f]);
    }
    let c = w.op(LONG);
    if let Some(c) = w.watch(c, &[4]) {
        w.cancel(&c);
    }
    w.advance(MS);
    w.ready_from(a_id, 1);
    w.check(1);
    w.check(2);
    w.still_expiring();
    w.shutdown();
    let late = w.op(LONG);
    w.watch(late, &[5]);
    w
}

/// A batch big enough to be a chunk: ready ones, never-ready ones on shared keys, a
/// refused one; a force of several; an event; expiries; `cancel_for_key`; shutdown.
fn batch(name: String) -> World {
    let mut w = manual(name);
    let mut ops = Vec::new();
    for i in 0..34u32 {
        let timeout = if i % 5 == 0 { MS } else { LONG };
        let op = w.op(timeout);
        if i % 7 == 3 {
            w.ready_from(op.0.id, 1);
        }
        let keys = match i {
            9 => vec![],
            _ => vec![i % 4, 10 + i % 3],
        };
        ops.push((op, keys));
    }
    let handles = w.watch_batch(ops);
    let forced: Vec<_> = handles.iter().flatten().skip(2).step_by(6).collect();
    w.force(&forced);
    w.advance(MS);
    w.check(1);
    w.cancel_for_key(2);
    w.still_expiring();
    w.shutdown();
    w
}

/// Keys: a check that empties a list (its stored key dropped), `cancel_for_key`, purges
/// of stale entries, a key shared by many operations; a shutdown that drops the rest.
fn keys(name: String) -> World {
    let mut w = manual(name);
    let mut ready = Vec::new();
    for k in 0..4u32 {
        let op = w.op(LONG);
        ready.push(op.0.id);
        w.watch(op, &[k, 20]);
    }
    for k in 0..3u32 {
        let op = w.op(LONG);
        w.watch(op, &[30 + k]);
    }
    for &id in &ready {
        w.ready_from(id, 1);
    }
    w.check(20);
    w.purge();
    w.cancel_for_key(30);
    w.check(31);
    w.still_expiring();
    w.shutdown();
    w
}

/// Expiries handed over: an operation whose `try_complete`, once armed, moves the clock
/// past its own timeout and runs a round (as a reaper would, meanwhile), so its expiry is
/// left to the holder: once in a check, once in a chunk's try.
fn hand_over(name: String) -> World {
    let mut w = manual(name);
    type Shared = Arc<Mutex<Option<(Purgatory<Key, Faulty>, ManualClock)>>>;
    let shared: Shared = Arc::new(Mutex::new(None));
    let armed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let inner = w.readiness();
    let (slot, now) = (Arc::clone(&shared), Arc::clone(&armed));
    let readiness: crate::probe::Readiness = Arc::new(move |id, attempt| {
        if now.load(std::sync::atomic::Ordering::SeqCst) {
            if let Some((purgatory, clock)) = slot.lock().unwrap().as_ref() {
                clock.advance(Duration::from_millis(5));
                purgatory.advance_clock(Duration::ZERO);
            }
        }
        inner(id, attempt)
    });
    *shared.lock().unwrap() = Some((w.purgatory().clone(), w.clock.clone()));
    let x = w.op_with(Duration::from_millis(2), Arc::clone(&readiness));
    w.watch(x, &[1]);
    armed.store(true, std::sync::atomic::Ordering::SeqCst);
    w.check(1);
    let mut batch = Vec::new();
    for i in 0..33u32 {
        let op = if i == 3 {
            w.op_with(Duration::from_millis(2), Arc::clone(&readiness))
        } else {
            w.op(Duration::from_millis(2))
        };
        batch.push((op, vec![100 + i]));
    }
    w.watch_batch(batch);
    armed.store(false, std::sync::atomic::Ordering::SeqCst);
    shared.lock().unwrap().take();
    w.still_expiring();
    w.shutdown();
    w
}

/// Expiry on a pool: the round hands its batches to a pool thread; shutdown waits for
/// them.
fn pool(name: String) -> World {
    let mut w = World::new(name, |builder, timer| {
        builder.timer(timer.executor(Executor::pool(1).expect("a pool")))
    });
    for k in 0..6u32 {
        let op = w.op(MS);
        w.watch(op, &[k]);
    }
    let op = w.op(LONG);
    w.watch(op, &[9]);
    w.advance(MS);
    w.shutdown();
    w
}

/// Shutdown from inside: an operation whose `on_complete` shuts its purgatory down, as
/// its expiry runs (the round is inside the purgatory's expiry work).
fn inside(name: String) -> World {
    let mut w = manual(name);
    let holder: Arc<Mutex<Option<Purgatory<Key, Faulty>>>> = Arc::new(Mutex::new(None));
    *holder.lock().unwrap() = Some(w.purgatory().clone());
    let mut op = w.op(MS);
    let hook = Arc::clone(&holder);
    op.1 = Some(Box::new(move || {
        if let Some(purgatory) = hook.lock().unwrap().take() {
            purgatory.shutdown();
        }
    }));
    w.watch(op, &[1]);
    for k in 2..5u32 {
        let op = w.op(LONG);
        w.watch(op, &[k]);
    }
    w.advance(MS);
    holder.lock().unwrap().take();
    w.shutdown();
    w
}

/// The last handle dropped with operations pending: they are expired by the drop.
fn last_drop(name: String) -> World {
    let mut w = manual(name);
    for k in 0..4u32 {
        let op = w.op(LONG);
        w.watch(op, &[k, 9]);
    }
    let short = w.op(MS);
    w.watch(short, &[5]);
    w.advance(MS);
    w.drop_last_handle();
    w
}

/// `Parked` (feature `tokio`): one dropped while it waits (cancelled, dropped by the
/// purgatory), one taken back with `try_cancel`, one left to expire.
#[cfg(feature = "tokio")]
fn parked(name: String) -> World {
    let mut w = manual(name);
    let mut parked = Vec::new();
    for k in 0..4u32 {
        let op = w.op(if k >= 2 { MS } else { LONG });
        let id = op.0.id;
        // The fourth is keyless (`park_keyless_with`), expired with the third; it has no
        // key to drop.
        let keys = (k < 3).then(|| vec![Key(k)]);
        match w.call("park", |p| match keys {
            Some(keys) => p.park_with(keys, |_reply: purgatory::Reply<()>| op),
            None => p.park_keyless_with(|_reply: purgatory::Reply<()>| op),
        }) {
            Some(Ok(p)) => {
                w.answered_or_cancelled(id);
                parked.push(Some(p));
            }
            Some(Err(refused)) => {
                w.refused(id);
                super::injector::quiet(|| drop(refused));
                parked.push(None);
            }
            None => w.lost(id),
        }
    }
    if let Some(Some(first)) = parked.get_mut(0).map(Option::take) {
        w.call("Parked::drop", move |_| drop(first));
    }
    if let Some(Some(second)) = parked.get_mut(1) {
        let mut second_taken = None;
        w.call("Parked::try_cancel", |_| second_taken = second.try_cancel());
        if let Some(op) = second_taken {
            w.handed_back(op);
        }
    }
    w.advance(MS);
    w.shutdown();
    drop(parked);
    w
}
