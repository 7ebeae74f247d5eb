//! The stand-in: so that one expired task's slow or blocked code (a purgatory's
//! `on_complete` that waits on a lock, a panic whose hook prints a backtrace for 100 ms)
//! delays no other expiry, with the default inline executor, at the cost of a watchdog
//! thread that looks every `bound` while expiry is under way (measured in
//! `docs/purgatory.md`, "Isolation").
//!
//! The reaper expires a batch inline, one task at a time, claiming each from a
//! [`SharedBatch`]; its round's hooks (the owner's `before_round` and `after_round`: the
//! purgatory completes orphans, purges lists and drops their keys, publishes metrics
//! there) are watched the same way, as a phase with no batch. A watchdog thread looks,
//! every `bound` while such work is going on, at
//! each driving thread's progress (its batches begun, and the claims made in the current
//! one: no counter of its own, nothing more per task than the claim). One that is inside a
//! batch and has not moved since the last look (`bound` or more) is stuck in one task's
//! code: the watchdog starts a stand-in thread, which claims the rest of that batch (if
//! it was in one) and expires it, then runs the rounds (as the reaper would, each waiting
//! at most `bound`) until it finds the stuck thread's batch or hook ended. A stand-in that gets stuck itself is relieved the same way, up to
//! [`MAX_DRIVERS`] driving threads at once; past that, expiry waits for one of them.
//!
//! # Driving slots
//! Each driving thread (the reaper in slot 0, stand-ins in the others) owns a
//! [`DrivingSlot`]:
//!
//! | field | written by | read by |
//! |---|---|---|
//! | `in_use` | the thread taking or leaving the slot | the watchdog, stand-in placement |
//! | `batch` | its thread, at a batch's begin and end (under its lock); none in a hook | the watchdog, to hand the batch to a stand-in |
//! | `busy` | its thread: true from a batch's (or a hook's) begin to its end | the watchdog; a stand-in, to know when to stop |
//! | `batches` | its thread: +1 at a batch's or a hook's begin | the watchdog (with the batch's claims, its progress); a stand-in, to know the stuck batch or hook ended |
//! | `relieved` | the watchdog (set; cleared again if it could not relieve it), its thread at a batch's begin (cleared) | the watchdog: one stand-in per stuck batch |
//!
//! # Invariants
//! - Every task of a batch is claimed exactly once, by its thread or a stand-in
//!   (`shared_batch.rs`), and expired by the claimer; nothing else moves a task.
//! - The work a stand-in takes over is counted as a round from before the stand-in is
//!   spawned until it finished the stolen tasks, so a shutdown from outside waits for it,
//!   as for any round (the driver's shutdown table is unchanged: a stand-in's rounds are
//!   rounds, and its threads are marked inside the driver's expiry work).
//! - The watchdog never runs user code and never waits for it: its only waits are its
//!   own timed sleeps and the control lock, which nobody holds around user code. So
//!   stopping it (shutdown) always returns.
//! - No stand-in is started after shutdown stopped the watchdog: a stand-in is spawned
//!   under the control lock, after checking `Control::stopped` there, and its handle kept
//!   under the same hold; shutdown sets `stopped` and takes the handles under that lock.
//!   A stand-in running then stops after its round, and an outside shutdown joins it.
//! - The watchdog starts with the reaper. With no batch or hook under way for
//!   [`IDLE_AFTER`] looks, it sleeps without a deadline until one begins (a `SeqCst`
//!   store of `busy` then load of `idle` on one side, store of `idle` then load of `busy`
//!   on the other: one of the two sees the other, so a batch never begins unwatched).
//!   Every round runs hooks, so a reaper that wakes often keeps it looking every bound;
//!   one that sleeps lets it sleep too.
//! - A stuck slot that could not be relieved (every slot taken, or a thread that could
//!   not start) is looked at again at the next look: `relieved` is cleared again.

use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::shared_batch::SharedBatch;
use crate::sync::{AtomicBool, AtomicU64, Condvar, Mutex};

/// Most threads driving one timer at once: the reaper and its stand-ins.
pub(crate) const MAX_DRIVERS: usize = 8;

/// Looks without a batch under way after which the watchdog sleeps without a deadline.
const IDLE_AFTER: u32 = 4;

/// The default bound: how long one task's expiry code may run before a stand-in takes
/// over the rest of its batch and the rounds.
pub const DEFAULT_STAND_IN_BOUND: Duration = Duration::from_millis(20);

/// One driving thread's slot (see the module doc).
pub(crate) struct DrivingSlot<T> {
    in_use: AtomicBool,
    busy: AtomicBool,
    batches: AtomicU64,
    relieved: AtomicBool,
    batch: Mutex<Option<Arc<SharedBatch<T>>>>,
}

impl<T> DrivingSlot<T> {
    fn new() -> Self {
        DrivingSlot {
            in_use: AtomicBool::new(false),
            busy: AtomicBool::new(false),
            batches: AtomicU64::new(0),
            relieved: AtomicBool::new(false),
            batch: Mutex::new(None),
        }
    }

    /// Where its thread is: batches begun, and claims made in the batch under way (if
    /// any). Unchanged between two looks: stuck in one task's code.
    fn progress(&self) -> (u64, usize) {
        let batches = self.batches.load(Relaxed);
        let claims = self.batch.lock().as_ref().map_or(0, |batch| batch.claims());
        (batches, claims)
    }
}

/// What the control lock guards.
struct Control {
    /// Shutdown stopped the watchdog: no stand-in starts any more.
    stopped: bool,
    /// The watchdog's and the stand-ins' threads, for shutdown to join.
    threads: Vec<JoinHandle<()>>,
}

impl Control {
    /// Keeps a started thread's handle for shutdown to join, forgetting those finished.
    fn keep(&mut self, handle: JoinHandle<()>) {
        self.threads.retain(|thread| !thread.is_finished());
        self.threads.push(handle);
    }
}

/// A driver's stand-in machinery (see the module doc).
pub(crate) struct StandIn<T> {
    bound: Duration,
    slots: Box<[DrivingSlot<T>]>,
    control: Mutex<Control>,
    wake: Condvar,
    /// The watchdog sleeps without a deadline (nothing under way).
    idle: AtomicBool,
    /// Every driving slot was taken at the last attempt to relieve one (warned once).
    saturated: AtomicBool,
    /// The name of the driver's threads, for the stand-ins'.
    name: String,
}

impl<T> StandIn<T> {
    pub(crate) fn new(bound: Duration, name: String) -> Self {
        let slots: Box<[DrivingSlot<T>]> = (0..MAX_DRIVERS).map(|_| DrivingSlot::new()).collect();
        // Slot 0 is the reaper's, from its start.
        slots[0].in_use.store(true, Relaxed);
        StandIn {
            bound,
            slots,
            control: Mutex::new(Control {
                stopped: false,
                threads: Vec::new(),
            }),
            wake: Condvar::default(),
            idle: AtomicBool::new(true),
            saturated: AtomicBool::new(false),
            name,
        }
    }

    /// Slot `index`'s thread begins expiring `batch`.
    pub(crate) fn begin(&self, index: usize, batch: &Arc<SharedBatch<T>>) {
        *self.slots[index].batch.lock() = Some(Arc::clone(batch));
        self.begin_work(index);
    }

    /// Slot `index`'s thread begins a round's hook (user code, with no batch). End it
    /// with [`end_hook`](Self::end_hook).
    #[inline]
    pub(crate) fn begin_hook(&self, index: usize) {
        self.begin_work(index);
    }

    /// Slot `index`'s thread finished a round's hook.
    #[inline]
    pub(crate) fn end_hook(&self, index: usize) {
        self.slots[index].busy.store(false, SeqCst);
    }

    /// A batch or a hook begins on slot `index`: watched from now on.
    fn begin_work(&self, index: usize) {
        let slot = &self.slots[index];
        slot.relieved.store(false, Relaxed);
        slot.batches.fetch_add(1, Relaxed);
        slot.busy.store(true, SeqCst);
        if self.idle.load(SeqCst) {
            let _control = self.control.lock();
            self.idle.store(false, SeqCst);
            self.wake.notify_all();
        }
    }

    /// How long one task's code may run before a stand-in takes over.
    pub(crate) fn bound(&self) -> Duration {
        self.bound
    }

    /// Slot `index`'s thread finished its batch (every task claimed).
    pub(crate) fn end(&self, index: usize) {
        let slot = &self.slots[index];
        slot.busy.store(false, SeqCst);
        drop(slot.batch.lock().take());
    }

    /// Takes a free slot for a stand-in.
    fn take_slot(&self) -> Option<usize> {
        (1..self.slots.len()).find(|&i| {
            self.slots[i]
                .in_use
                .compare_exchange(false, true, SeqCst, Relaxed)
                .is_ok()
        })
    }

    /// A stand-in leaves its slot.
    pub(crate) fn leave(&self, index: usize) {
        self.slots[index].in_use.store(false, SeqCst);
    }

    /// Whether slot `index` is still in the batch that was its `batches`-th.
    pub(crate) fn still_in(&self, index: usize, batches: u64) -> bool {
        let slot = &self.slots[index];
        slot.busy.load(SeqCst) && slot.batches.load(Relaxed) == batches
    }

    /// Stops the watchdog: no stand-in starts after this.
    pub(crate) fn stop(&self) {
        self.control.lock().stopped = true;
        self.wake.notify_all();
    }

    /// Gives back every thread to join, once: the watchdog's first, then the
    /// stand-ins'. Called after [`stop`](Self::stop) by an outside shutdown; an inside
    /// one leaves them for the next outside call.
    pub(crate) fn take_threads(&self) -> Vec<JoinHandle<()>> {
        std::mem::take(&mut self.control.lock().threads)
    }

    /// Keeps the watchdog's handle for shutdown (started with the driver, before
    /// anyone can shut it down).
    pub(crate) fn keep_watchdog(&self, handle: JoinHandle<()>) {
        self.control.lock().keep(handle);
    }

    /// The watchdog's loop: `relieve` is called with each stuck slot's index, its batch
    /// (`None` in a hook) and that batch's (or hook's) number, and a stand-in's slot, and
    /// starts the stand-in (its thread's handle, or `None` if it could not start).
    /// Returns when shutdown stops it.
    pub(crate) fn watch(
        &self,
        mut relieve: impl FnMut(
            usize,
            Option<Arc<SharedBatch<T>>>,
            u64,
            usize,
        ) -> Option<JoinHandle<()>>,
    ) {
        let mut seen = [(0u64, 0usize); MAX_DRIVERS];
        let mut quiet = 0;
        loop {
            {
                let mut control = self.control.lock();
                if control.stopped {
                    return;
                }
                if self.idle.load(SeqCst) {
                    control = self.wake.wait_until(control, None);
                    drop(control);
                    // Woken by a batch: look again only a whole bound from now.
                    for (i, slot) in self.slots.iter().enumerate() {
                        seen[i] = slot.progress();
                    }
                    continue;
                }
                let deadline = Instant::now() + self.bound;
                while !control.stopped && Instant::now() < deadline {
                    control = self.wake.wait_until(control, Some(deadline));
                }
                if control.stopped {
                    return;
                }
            }
            let mut under_way = false;
            for (i, slot) in self.slots.iter().enumerate() {
                let progress = slot.progress();
                if slot.in_use.load(SeqCst) && slot.busy.load(SeqCst) {
                    under_way = true;
                    if progress == seen[i] && !slot.relieved.swap(true, SeqCst) {
                        self.relieve_slot(i, &mut relieve);
                    }
                }
                seen[i] = progress;
            }
            if under_way {
                quiet = 0;
            } else {
                quiet += 1;
                if quiet >= IDLE_AFTER {
                    quiet = 0;
                    self.idle.store(true, SeqCst);
                    if self.slots.iter().any(|slot| slot.busy.load(SeqCst)) {
                        self.idle.store(false, SeqCst);
                    }
                }
            }
        }
    }

    /// Hands stuck slot `stuck`'s batch (if it is in one) to a stand-in in a free slot,
    /// if it is still stuck and a slot is free.
    fn relieve_slot(
        &self,
        stuck: usize,
        relieve: &mut impl FnMut(
            usize,
            Option<Arc<SharedBatch<T>>>,
            u64,
            usize,
        ) -> Option<JoinHandle<()>>,
    ) {
        let slot = &self.slots[stuck];
        // Its batch, or none if it is stuck in a round's hook.
        let batch = slot.batch.lock().clone();
        let batches = slot.batches.load(Relaxed);
        if !self.still_in(stuck, batches) {
            return; // it moved on meanwhile
        }
        // Not relieved after all: the next look tries again (a slot may be free then).
        let not_relieved = || slot.relieved.store(false, SeqCst);
        let Some(free) = self.take_slot() else {
            not_relieved();
            if !self.saturated.swap(true, Relaxed) {
                crate::user_code::event(|| {
                    tracing::warn!(
                        target: "timer_core",
                        "expiry code stuck on every driving thread ({MAX_DRIVERS}); expiry waits for one"
                    )
                });
            }
            return;
        };
        self.saturated.store(false, Relaxed);
        // Started under the control lock, which shutdown takes to stop the watchdog: a
        // stand-in either starts before the stop, and is joined, or not at all.
        let mut control = self.control.lock();
        if control.stopped {
            self.leave(free);
            return;
        }
        match relieve(stuck, batch, batches, free) {
            Some(thread) => control.keep(thread),
            None => {
                self.leave(free);
                not_relieved();
            }
        }
    }

    /// The name of a stand-in's thread.
    pub(crate) fn thread_name(&self) -> String {
        format!("{}-stand-in", self.name)
    }
}
