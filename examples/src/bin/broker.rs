//! `broker`: a small Kafka-protocol broker with the purgatory in its request path.
//! See `purgatory_examples::broker` and `--help`.

use std::process::ExitCode;

use purgatory_examples::broker::config::USAGE;
use purgatory_examples::broker::{metrics_endpoint, Broker, BrokerConfig};
use purgatory_examples::cli::FlagError;
use purgatory_examples::huge_allocations::HugeAllocationsMappedLazily;
use purgatory_examples::signal::terminated;

/// Survives the impossible allocations a malformed request can make the codec ask for.
#[global_allocator]
static ALLOCATOR: HugeAllocationsMappedLazily = HugeAllocationsMappedLazily;

fn main() -> ExitCode {
    let config = match BrokerConfig::from_args(std::env::args().skip(1)) {
        Ok(config) => config,
        Err(FlagError::HelpRequested) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("broker: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("broker: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        // Before the broker, so the purgatories' first figures reach the recorder.
        let metrics = config
            .metrics_listen
            .map(|addr| metrics_endpoint::start(addr, config.metrics_max_connections));
        let _metrics = match metrics {
            None => None,
            Some(started) => match started.await {
                Ok(endpoint) => {
                    println!("metrics on http://{}/metrics", endpoint.local_addr());
                    Some(endpoint)
                }
                Err(e) => {
                    eprintln!("broker: cannot serve metrics: {e}");
                    return ExitCode::FAILURE;
                }
            },
        };
        let broker = match Broker::start_with(config.clone(), true).await {
            Ok(broker) => broker,
            Err(e) => {
                eprintln!("broker: cannot listen on {}: {e}", config.listen);
                return ExitCode::FAILURE;
            }
        };
        let followers = match (config.followers.count, config.followers.stalled) {
            (0, _) => "no followers".to_string(),
            (n, true) => format!("{n} stalled follower(s)"),
            (n, false) => format!(
                "{n} follower(s) {} ms behind",
                config.followers.lag.as_millis()
            ),
        };
        println!(
            "broker listening on {} (topic {:?}, {} partition(s), {followers})",
            broker.local_addr(),
            config.topic,
            config.partitions,
        );
        terminated().await;
        // After the shutdown, which expires what still waits.
        let stats = broker.shutdown().await;
        let counters = |p: &purgatory::PurgatoryStats| {
            format!(
                "{} completed / {} expired / {} expired at shutdown / {} cancelled (client left)",
                p.completed, p.expired, p.expired_at_shutdown, p.cancelled
            )
        };
        println!(
            "broker stopped: produce purgatory {}, fetch purgatory {}",
            counters(&stats.leader.produce),
            counters(&stats.leader.fetch)
        );
        ExitCode::SUCCESS
    })
}
