//! `axum_service`: the axum example service (long polls, produces waiting for follower
//! acks, Prometheus metrics) until Ctrl-C or SIGTERM, which answers every parked
//! request 503 at once, then stops. See `purgatory_examples::axum_service` and `--help`.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use purgatory_examples::axum_service::metrics::install_prometheus;
use purgatory_examples::axum_service::{serve, Config, Service};
use purgatory_examples::cli::{FlagError, Flags};
use purgatory_examples::signal::terminated;

const USAGE: &str = "usage: axum_service [--listen ADDR] [--followers N] [--replication-delay-ms D]
Serves on ADDR (default 127.0.0.1:8080; port 0 picks one, printed at start):
  GET  /poll/TOPIC?after=N&wait_ms=M       200 + end offset once it passes N, 204 after M ms
  POST /produce/TOPIC?acks=K&timeout_ms=M  200 + offset once K of the N followers (default 2)
                                           copied it, D ms after the append (default 50); 408 after M ms
  GET  /metrics                            the purgatories' figures, Prometheus text
Ctrl-C or SIGTERM answers every waiting request 503, then stops.";

fn main() -> ExitCode {
    let parsed = Flags::parse(
        std::env::args().skip(1),
        &["--listen", "--followers", "--replication-delay-ms"],
        &[],
    )
    .and_then(|flags| {
        Ok((
            flags.get("--listen", SocketAddr::from(([127, 0, 0, 1], 8080)))?,
            flags.get("--followers", 2usize)?,
            Duration::from_millis(flags.get("--replication-delay-ms", 50u64)?),
        ))
    });
    let (listen, followers, replication_delay) = match parsed {
        Ok(values) => values,
        Err(FlagError::HelpRequested) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("axum_service: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("axum_service: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        // Before the service, so the purgatories' histograms register with it.
        let prometheus = match install_prometheus() {
            Ok(handle) => handle,
            Err(e) => {
                eprintln!("axum_service: cannot install the metrics recorder: {e}");
                return ExitCode::FAILURE;
            }
        };
        let listener = match tokio::net::TcpListener::bind(listen).await {
            Ok(listener) => listener,
            Err(e) => {
                eprintln!("axum_service: cannot listen on {listen}: {e}");
                return ExitCode::FAILURE;
            }
        };
        let service = Service::new(Config {
            followers,
            replication_delay,
            prometheus: Some(prometheus),
            ..Config::default()
        });
        match listener.local_addr() {
            Ok(addr) => println!(
                "axum_service listening on http://{addr} ({followers} follower(s) {} ms behind)",
                replication_delay.as_millis()
            ),
            Err(e) => eprintln!("axum_service: listening, address unknown: {e}"),
        }
        if let Err(e) = serve(listener, service.clone(), terminated()).await {
            eprintln!("axum_service: {e}");
            return ExitCode::FAILURE;
        }
        let counts = |p: purgatory::PurgatoryStats| {
            format!(
                "{} completed / {} expired / {} answered at shutdown / {} cancelled (client left)",
                p.completed, p.expired, p.expired_at_shutdown, p.cancelled
            )
        };
        println!(
            "axum_service stopped: polls {}; produces {}",
            counts(service.polls().stats()),
            counts(service.produces().stats())
        );
        ExitCode::SUCCESS
    })
}
