//! The signal the binaries stop on: Ctrl-C, or SIGTERM (what a service manager or
//! `kill` sends), whichever comes first.

/// Waits for Ctrl-C or SIGTERM (Ctrl-C alone where SIGTERM cannot be listened for).
pub async fn terminated() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut terminate) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = terminate.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
