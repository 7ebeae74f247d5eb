//! An axum service with two purgatories in its request path: what a tokio engineer
//! copies to serve long polls and acknowledged writes (binary `axum_service`).
//!
//! | endpoint | answers | purgatory |
//! |---|---|---|
//! | `GET /poll/{topic}?after=N&wait_ms=M` | 200 with the end offset once it passes `N`; 204 after `M` ms; 503 at shutdown | polls: `wait_until` (a condition and a timeout), [`long_poll`] |
//! | `POST /produce/{topic}?acks=K&timeout_ms=M` | appends; 200 with the record's offset once `K` followers copied it; 408 after `M` ms; 503 at shutdown | produces: a [`DelayedProduce`] parked with `park_with`, [`produce`] |
//! | `GET /metrics` | both purgatories' figures as Prometheus text | [`metrics`] |
//!
//! Followers are simulated: tasks that copy every append `replication_delay` after it
//! ([`followers`]). Topics are made on first use ([`topics`]).
//!
//! # Invariants
//! - Every request parked in a purgatory is answered exactly once, by what happened
//!   (its event, its timeout, the shutdown), or cancelled when its client leaves: hyper
//!   drops the handler's future, and with it the `Wait` or `Parked`, whose drop cancels
//!   the operation (counted `cancelled`, no callback).
//! - [`serve`] shuts the purgatories down when the signal comes and before hyper waits
//!   for the requests in flight, so parked requests are answered 503 at once (see
//!   `serve.rs` for why the order matters).
//! - [`Service::new`] runs in a tokio runtime: the purgatories keep its handle for their
//!   callbacks, and the followers are its tasks.

pub mod followers;
pub mod long_poll;
pub mod metrics;
pub mod produce;
mod serve;
pub mod topics;

use std::sync::Arc;
use std::time::Duration;

use axum::routing::{get, post};
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;
use purgatory::{LongPoll, Purgatory};

pub use serve::serve;

use followers::Followers;
use produce::DelayedProduce;
use topics::Topics;

/// How a [`Service`] is set up.
#[derive(Debug, Clone)]
pub struct Config {
    /// Simulated followers of every topic: the most `acks` a produce can ask for.
    pub followers: usize,
    /// How long after an append the followers have copied it.
    pub replication_delay: Duration,
    /// The cap on `wait_ms` and `timeout_ms`.
    pub max_wait: Duration,
    /// The most topics the service makes.
    pub max_topics: usize,
    /// The Prometheus recorder's handle ([`metrics::install_prometheus`]) that `/metrics`
    /// renders; `None` answers 404 there.
    pub prometheus: Option<PrometheusHandle>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            followers: 2,
            replication_delay: Duration::from_millis(50),
            max_wait: Duration::from_secs(300),
            max_topics: 10_000,
            prometheus: None,
        }
    }
}

/// The service's state, shared by every handler: a cheap `Clone`.
#[derive(Debug, Clone)]
pub struct Service(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    topics: Topics,
    polls: Purgatory<String, LongPoll>,
    produces: Purgatory<String, DelayedProduce>,
    followers: Followers,
    max_wait: Duration,
    prometheus: Option<PrometheusHandle>,
}

impl Service {
    /// Builds the purgatories and starts the followers, on the current runtime.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn new(config: Config) -> Self {
        // Two services in one process (tests) publish as `poll` and `poll#2`:
        // `Purgatory::metrics_label` says which is whose.
        let polls = Purgatory::new("poll");
        let produces = Purgatory::new("produce");
        assert!(
            polls.runtime().is_some() && produces.runtime().is_some(),
            "build the service inside a tokio runtime"
        );
        let followers = Followers::spawn(config.followers, config.replication_delay, &produces);
        Service(Arc::new(Inner {
            topics: Topics::new(config.followers, config.max_topics),
            polls,
            produces,
            followers,
            max_wait: config.max_wait,
            prometheus: config.prometheus,
        }))
    }

    /// The purgatory of long polls, watched per topic.
    pub fn polls(&self) -> &Purgatory<String, LongPoll> {
        &self.0.polls
    }

    /// The purgatory of produces waiting for their acks, watched per topic.
    pub fn produces(&self) -> &Purgatory<String, DelayedProduce> {
        &self.0.produces
    }

    /// The topics.
    pub fn topics(&self) -> &Topics {
        &self.0.topics
    }

    /// The simulated followers.
    pub fn followers(&self) -> &Followers {
        &self.0.followers
    }

    /// The Prometheus handle `/metrics` renders, if any.
    pub fn prometheus(&self) -> Option<&PrometheusHandle> {
        self.0.prometheus.as_ref()
    }

    /// A wait of `millis` asked by a client, capped.
    pub fn wait_for(&self, millis: u64) -> Duration {
        Duration::from_millis(millis).min(self.0.max_wait)
    }

    /// Answers every parked request (`Completion::Shutdown`: 503) and refuses later
    /// ones; stops the followers. Resolves once every parked request has its answer.
    pub async fn shutdown(&self) {
        // On the blocking pool, both at once: no worker waits.
        tokio::join!(
            self.0.polls.shutdown_async(),
            self.0.produces.shutdown_async()
        );
        self.0.followers.stop();
    }
}

/// The routes, over `service`.
pub fn router(service: Service) -> Router {
    Router::new()
        .route("/poll/{topic}", get(long_poll::long_poll))
        .route("/produce/{topic}", post(produce::produce))
        .route("/metrics", get(metrics::metrics))
        .with_state(service)
}
