//! `coordinator`: a group coordinator's sessions (join barrier, heartbeats, session
//! timeouts) on the purgatory and on a tokio-util `DelayQueue`, loaded side by side; the
//! logic lives in `purgatory_examples::coordinator`.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use purgatory_examples::cli::{FlagError, Flags};
use purgatory_examples::coordinator::load::{self, describe, median, Load, RunResult, Version};
use purgatory_examples::coordinator::on_delay_queue::OnDelayQueue;
use purgatory_examples::coordinator::on_purgatory::OnPurgatory;
use purgatory_examples::coordinator::{server, Config, Coordinator};

const USAGE: &str = "usage: coordinator [--sessions both|purgatory|delay-queue] [--members N]
       [--group-size G] [--rate R] [--secs S] [--warm-secs W] [--rounds K]
       [--connections C] [--dead-every D] [--session-timeout-ms T]
       [--rebalance-timeout-ms B] [--server-threads P]
Starts a coordinator server per run (this binary, mode `serve`), joins N members (default
50,000) in groups of G (100), then heartbeats every live member at R heartbeats/s in all
(23,800) over C connections (32) for W + S seconds (2 + 20), one member in D (100) never
heartbeating, so its session (T ms, default 10,000) expires. K rounds (3), the versions
alternating: heartbeat round trips, server CPU and threads, expiries and their lateness,
and the medians side by side.
       coordinator serve --sessions purgatory|delay-queue [--members N] [--group-size G]
       [--session-timeout-ms T] [--rebalance-timeout-ms B] [--server-threads P]
Serves on 127.0.0.1 (prints `listening ADDR`) until stdin closes.";

const CONFIG_FLAGS: [&str; 5] = [
    "--members",
    "--group-size",
    "--session-timeout-ms",
    "--rebalance-timeout-ms",
    "--server-threads",
];

fn config(flags: &Flags) -> Result<Config, FlagError> {
    let members: u32 = flags.get("--members", 50_000)?;
    let group_size: u32 = flags.get("--group-size", 100)?;
    if members == 0 || group_size == 0 {
        return Err(FlagError::BadValue {
            flag: "--members/--group-size".into(),
            value: "0".into(),
            why: "must be at least 1".into(),
        });
    }
    Ok(Config {
        members,
        group_size,
        session_timeout: Duration::from_millis(flags.get("--session-timeout-ms", 10_000)?),
        rebalance_timeout: Duration::from_millis(flags.get("--rebalance-timeout-ms", 30_000)?),
    })
}

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let serving = args.first().is_some_and(|a| a == "serve");
    if serving {
        args.remove(0);
    }
    let mut with_value = vec!["--sessions"];
    with_value.extend(CONFIG_FLAGS);
    if !serving {
        with_value.extend([
            "--rate",
            "--secs",
            "--warm-secs",
            "--rounds",
            "--connections",
            "--dead-every",
        ]);
    }
    let flags = match Flags::parse(args, &with_value, &[]) {
        Ok(flags) => flags,
        Err(FlagError::HelpRequested) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("coordinator: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let result = if serving {
        serve(&flags)
    } else {
        compare(&flags)
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("coordinator: {e}");
            ExitCode::FAILURE
        }
    }
}

fn serve(flags: &Flags) -> Result<(), Box<dyn std::error::Error>> {
    let config = config(flags)?;
    let version_name: String = flags.get("--sessions", "purgatory".to_owned())?;
    let version = Version::parse(&version_name).ok_or("--sessions: purgatory or delay-queue")?;
    let threads: usize = flags.get("--server-threads", 2)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .thread_name("coord-server")
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let coordinator: Arc<dyn Coordinator> = match version {
            Version::Purgatory => Arc::new(OnPurgatory::new(config)),
            Version::DelayQueue => Arc::new(OnDelayQueue::new(config)),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        println!("listening {}", listener.local_addr()?);
        // Stops when stdin closes (the load that started it is done, or gone).
        let stdin_closed = tokio::task::spawn_blocking(|| {
            let mut sink = Vec::new();
            let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
        });
        server::serve(listener, Arc::clone(&coordinator), async {
            let _ = stdin_closed.await;
        })
        .await;
        coordinator.shutdown().await;
        Ok::<(), Box<dyn std::error::Error>>(())
    })?;
    runtime.shutdown_timeout(Duration::from_secs(1));
    Ok(())
}

fn compare(flags: &Flags) -> Result<(), Box<dyn std::error::Error>> {
    let config = config(flags)?;
    let sessions: String = flags.get("--sessions", "both".to_owned())?;
    let versions = match sessions.as_str() {
        "both" => vec![Version::Purgatory, Version::DelayQueue],
        name => vec![Version::parse(name).ok_or("--sessions: both, purgatory or delay-queue")?],
    };
    let load = Load {
        config,
        rate: flags.get("--rate", 23_800.0)?,
        connections: flags
            .get::<u32>("--connections", 32)?
            .clamp(1, config.members),
        dead_every: flags.get("--dead-every", 100)?,
        warm: Duration::from_secs(flags.get("--warm-secs", 2)?),
        secs: Duration::from_secs(flags.get::<u64>("--secs", 20)?.max(1)),
    };
    if !(load.rate > 0.0 && load.rate.is_finite()) {
        return Err("--rate must be above 0".into());
    }
    let rounds: u32 = flags.get("--rounds", 3)?;
    println!(
        "coordinator: {} members in {} groups, {} heartbeats/s over {} connections, session timeout {} ms, one member in {} dead; {} round(s) of {} s (after {} s warm)",
        config.members,
        config.groups(),
        load.rate,
        load.connections,
        config.session_timeout.as_millis(),
        load.dead_every,
        rounds,
        load.secs.as_secs(),
        load.warm.as_secs()
    );
    let mut results: Vec<RunResult> = Vec::new();
    for round in 0..rounds.max(1) {
        // Alternate which version goes first.
        let mut order = versions.clone();
        if round % 2 == 1 {
            order.reverse();
        }
        for version in order {
            let label = format!("round {}/{}", round + 1, rounds.max(1));
            let result = load::run(version, &load, &label)?;
            println!("{label} {}", describe(&result));
            results.push(result);
        }
    }
    println!("summary (medians of {} run(s) each):", rounds.max(1));
    let mut medians = Vec::new();
    for version in &versions {
        let of = |f: &dyn Fn(&RunResult) -> f64| {
            let mut values: Vec<f64> = results
                .iter()
                .filter(|r| r.version == *version)
                .map(f)
                .collect();
            median(&mut values)
        };
        let p99 = of(&|r| r.heartbeats.p99.as_secs_f64() * 1e3);
        let cpu = of(&|r| r.cpu_per_sec);
        let threads = of(&|r| r.threads as f64);
        let late = of(&|r| r.stats.late_max_us as f64 / 1e3);
        println!(
            "  {}: heartbeat p99 {p99:.3} ms, server CPU {cpu:.3} s/s, {threads:.0} threads, latest expiry {late:.1} ms after its deadline",
            version.name()
        );
        medians.push((p99, cpu));
    }
    if let [(p99_ours, cpu_ours), (p99_peer, cpu_peer)] = medians[..] {
        println!(
            "  purgatory / delay-queue: heartbeat p99 {:.2}x, server CPU {:.2}x",
            p99_ours / p99_peer,
            cpu_ours / cpu_peer
        );
    }
    let wrong: Vec<&RunResult> = results
        .iter()
        .filter(|r| r.stats.expired != r.dead || r.heartbeat_errors > 0 || r.join_errors > 0)
        .collect();
    if !wrong.is_empty() {
        return Err(format!(
            "{} run(s) expired the wrong sessions or refused a live member (see above)",
            wrong.len()
        )
        .into());
    }
    Ok(())
}
