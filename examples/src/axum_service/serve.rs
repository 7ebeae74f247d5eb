//! Serving the router until a shutdown signal, answering every parked request at once
//! when it comes.
//!
//! The natural order, `axum::serve(..).with_graceful_shutdown(signal).await` and then
//! `shutdown_async()` on the purgatories, waits out every parked request: on the signal
//! hyper stops accepting and waits for the requests in flight, and a parked long poll is
//! in flight until its own timeout (30 s by default) answers it. So the purgatories shut
//! down first, inside the graceful-shutdown future, before it resolves: every parked
//! request is answered `Completion::Shutdown` (503) at once, and hyper then has only
//! those answers to write.
//!
//! # Invariants
//! - Between the signal and the end of the purgatories' shutdown, hyper still accepts
//!   (axum stops accepting when the signal future resolves): a request arriving then is
//!   refused by the purgatory, answered 503 at once.
//! - `serve` returns once every connection is closed: each got its answer (or its
//!   client left).

use std::future::Future;
use std::io;

use tokio::net::TcpListener;

use super::{router, Service};

/// Serves `service` on `listener` until `shutdown_signal` resolves; then answers every
/// parked request 503 (the purgatories' `shutdown_async`), stops the followers, and
/// returns once hyper has written the answers and closed the connections.
pub async fn serve<F>(listener: TcpListener, service: Service, shutdown_signal: F) -> io::Result<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    let app = router(service.clone());
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            shutdown_signal.await;
            // Before this future resolves, i.e. before hyper starts waiting for the
            // requests in flight: parked ones are answered now, not at their timeouts.
            service.shutdown().await;
        })
        .await
}
