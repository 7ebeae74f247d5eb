//! Issue #36: a tracing subscriber that takes 1.5 s an event (a log sink stuck on a full
//! disk) delays neither the relief of late expiry nor a shutdown. The relief machinery
//! reports (stand-ins started, the limit reached) from a thread of its own
//! (`src/stand_in.rs`, `Reports`). Before, the watchdog called the subscriber itself,
//! holding its control lock: a second blocked task went unrelieved behind the report of
//! the first (others 1.36 s late) and `shutdown()` took 1,240 ms with nothing pending.
//!
//! The subscriber is the process's global default (the driver's threads report to it),
//! so this test has a binary of its own. Asserted at the bound in a release build, as CI's
//! release step runs it (`cargo test --release -p purgatory-timer --test
//! slow_subscriber`; twice the bound in a debug build), and run again before it fails
//! (`support/on_time.rs`).

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use timer_core::{Timer, TimerBuilder};

#[path = "support/on_time.rs"]
mod support;
use support::{in_one_of_three, on_time, under, Ran, Recorded};

/// Events the subscriber was given.
static EVENTS: AtomicUsize = AtomicUsize::new(0);

/// Every event of the timer takes 1.5 s.
struct SlowForTheTimer;

impl tracing::Subscriber for SlowForTheTimer {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        metadata.target().starts_with("timer_core")
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, _: &tracing::Event<'_>) {
        EVENTS.fetch_add(1, SeqCst);
        std::thread::sleep(Duration::from_millis(1_500));
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[test]
fn a_slow_subscriber_delays_neither_relief_nor_shutdown() {
    tracing::subscriber::set_global_default(SlowForTheTimer).expect("the only subscriber");
    in_one_of_three(|| {
        let timer: Timer<Recorded> = TimerBuilder::new()
            .thread_name("slow-subscriber")
            .build()
            .unwrap();
        let ran: Ran = Arc::default();
        let start = Instant::now();
        let add = |at: Duration, blocks: u64| {
            let task = Recorded {
                deadline: at,
                blocks: Duration::from_millis(blocks),
                ran: Arc::clone(&ran),
            };
            timer.add(at, task).unwrap();
        };
        // A task blocking 300 ms at 10 ms, relieved (reported to the subscriber: 1.5 s); a
        // second at 200 ms, relieved while that report is still being written; quick tasks
        // every 10 ms among them, 1 us past the millisecond.
        add(Duration::from_millis(10), 300);
        add(Duration::from_millis(200), 300);
        let quick = (20..500).step_by(10).count();
        for at in (20..500).step_by(10) {
            add(Duration::from_millis(at) + Duration::from_micros(1), 0);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while ran.lock().unwrap().len() < 2 + quick && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        let late = ran
            .lock()
            .unwrap()
            .iter()
            .filter(|(at, _)| at.subsec_micros() % 1000 == 1)
            .map(|(at, when)| when.duration_since(start).saturating_sub(*at))
            .max()
            .expect("the quick tasks ran");
        assert_eq!(ran.lock().unwrap().len(), 2 + quick, "every task ran");
        // Nothing pending, nothing running, the reporter still in its 1.5 s events: a
        // shutdown has nothing to wait for.
        std::thread::sleep(Duration::from_millis(100));
        let before = Instant::now();
        timer.shutdown();
        let shutdown_took = before.elapsed();
        assert!(
            EVENTS.load(SeqCst) > 0,
            "the relief reports reached the subscriber"
        );
        let late = on_time("a quick task beside a slow subscriber", late);
        let shutdown = under(
            "shutdown beside a slow subscriber",
            shutdown_took,
            Duration::from_millis(50),
        );
        match (late, shutdown) {
            (Ok(late), Ok(shutdown)) => Ok(format!("{late}; {shutdown}")),
            (late, shutdown) => Err(format!("{late:?}; {shutdown:?}")),
        }
    });
}
