//! `GET /metrics`: the purgatories' figures as Prometheus text.
//!
//! With the cargo feature `metrics`, each purgatory publishes its gauges and counters
//! (`purgatory_pending`, `purgatory_completed_total`, ..., labelled with the purgatory's
//! name) through the `metrics` facade, about once a second from its reaper.
//! `metrics-exporter-prometheus`'s recorder, installed once per process by
//! [`install_prometheus`], collects them; the handler publishes both purgatories now
//! (`publish_metrics`), so a scrape reads figures as of the scrape, then renders.
//!
//! # Invariants
//! - The recorder is the process's: it is installed at most once, and every later call
//!   gets the same handle (the binary calls it once; tests start many services in one
//!   process). It fails only if another recorder was installed first.
//! - A service built without a handle answers 404 here.

use std::io;
use std::sync::OnceLock;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use super::Service;

/// Installs the Prometheus recorder for the whole process the first time; returns its
/// handle, the same on every call. Call it before building the services whose figures
/// it should collect (their wait-time histograms register with the recorder current at
/// build time, and again at each publish).
pub fn install_prometheus() -> io::Result<PrometheusHandle> {
    static RECORDER: OnceLock<Result<PrometheusHandle, String>> = OnceLock::new();
    RECORDER
        .get_or_init(|| {
            PrometheusBuilder::new()
                .install_recorder()
                .map_err(|e| e.to_string())
        })
        .clone()
        .map_err(io::Error::other)
}

/// The handler.
pub async fn metrics(State(service): State<Service>) -> Response {
    let Some(prometheus) = service.prometheus() else {
        return (StatusCode::NOT_FOUND, "metrics not enabled").into_response();
    };
    service.polls().publish_metrics();
    service.produces().publish_metrics();
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        prometheus.render(),
    )
        .into_response()
}
