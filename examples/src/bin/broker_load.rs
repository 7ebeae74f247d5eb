//! `broker_load`: measures the example broker (workload W4). See `purgatory_examples::load`.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use purgatory_examples::cli::{FlagError, Flags};
use purgatory_examples::load::latency_summary::{ms, LatencySummary};
use purgatory_examples::load::{
    fetch_wakeup, flood, hostile, idle_polls, left_polls, produce_latency, timer_jitter,
};

const USAGE: &str = "usage: broker_load COMMAND [--broker ADDR] [--topic NAME] [--partition P] ...
commands:
  produce-latency  [--requests N (2000)] [--connections C (1)] [--acks all|1] [--record-bytes B (100)]
                   [--timeout-ms T (30000)] [--replication-delay-ms D (0): subtracted in the report]
                   [--parked-fetches F (0)] [--fetch-entries E (1)]: F fetches naming the partition
                   E times wait (for more bytes than will come) during the run
  fetch-wakeup     [--rounds N (500)] [--max-wait-ms W (10000)] [--park-ms P (5)]
  idle-polls       [--connections N (10000)] [--max-wait-ms W (60000)] [--idle-s S (10)] [--broker-pid PID]
  left-polls       --broker-pid PID [--connections N (5000)]: N long polls (max_wait 2^31-1 ms)
                   whose clients then all leave; the broker's descriptors and RSS until back
  hostile          --broker-pid PID --scenario pipelined-polls|slow-readers|metadata-echo|partial-frames
                   |padded-poll|list-offsets-echo|produce-echo|fetch-echo|polls-then-partial
                   |retention-readers
                   [--connections N (100)] [--names K (3000)] [--mib M (90)]: N clients each doing
                   the scenario of issue #23, #29 or #38 (finding 5) and staying; the broker's RSS
                   per connection
  flood            [--connections N (10000)] [--fetch-entries E (6)] [--producers P (8)] [--flood-s S (20)]
                   [--record-bytes B (10)] [--timeout-ms T (5000)] [--catch-up-s C (300)]: N polls that cannot complete wait
                   while P connections send acks=0 produces for S s; a good client's acks=all
                   produces (timeout T) during the flood, then how long until one is acknowledged
                   (C s at most)
  timer-jitter     [--sleep-ms D (50)] [--samples N (200)]: lateness of timed sleeps, no broker
--broker defaults to 127.0.0.1:9092, --topic to demo, --partition to 0.";

fn fail(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("broker_load: {e}");
    ExitCode::FAILURE
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let Some(command) = args.next() else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let flags = Flags::parse(
        args,
        &[
            "--broker",
            "--topic",
            "--partition",
            "--requests",
            "--connections",
            "--acks",
            "--record-bytes",
            "--timeout-ms",
            "--replication-delay-ms",
            "--rounds",
            "--max-wait-ms",
            "--park-ms",
            "--idle-s",
            "--broker-pid",
            "--sleep-ms",
            "--samples",
            "--parked-fetches",
            "--fetch-entries",
            "--scenario",
            "--names",
            "--producers",
            "--flood-s",
            "--catch-up-s",
            "--mib",
        ],
        &[],
    );
    let flags = match flags {
        Ok(flags) => flags,
        Err(FlagError::HelpRequested) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("broker_load: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return fail(e),
    };
    match runtime.block_on(run(&command, &flags)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(RunError::Usage(e)) => {
            eprintln!("broker_load: {e}\n{USAGE}");
            ExitCode::from(2)
        }
        Err(RunError::Failed(e)) => fail(e),
    }
}

enum RunError {
    Usage(String),
    Failed(String),
}

impl From<FlagError> for RunError {
    fn from(e: FlagError) -> Self {
        RunError::Usage(e.to_string())
    }
}

impl From<std::io::Error> for RunError {
    fn from(e: std::io::Error) -> Self {
        RunError::Failed(e.to_string())
    }
}

fn show(summary: Option<LatencySummary>) -> String {
    summary.map_or_else(|| "no samples".to_string(), |s| s.to_string())
}

async fn run(command: &str, flags: &Flags) -> Result<(), RunError> {
    let broker: SocketAddr = flags.get("--broker", "127.0.0.1:9092".parse().expect("valid"))?;
    let topic: String = flags.get("--topic", "demo".to_string())?;
    let partition: i32 = flags.get("--partition", 0)?;
    match command {
        "produce-latency" => {
            let acks = match flags.get("--acks", "all".to_string())?.as_str() {
                "all" | "-1" => -1,
                "1" => 1,
                other => return Err(RunError::Usage(format!("--acks {other}: use all or 1"))),
            };
            let config = produce_latency::ProduceLatencyConfig {
                broker,
                topic,
                partition,
                requests: flags.get("--requests", 2000)?,
                connections: flags.get("--connections", 1)?,
                record_bytes: flags.get("--record-bytes", 100)?,
                acks,
                timeout_ms: flags.get("--timeout-ms", 30_000)?,
                parked_fetches: flags.get("--parked-fetches", 0)?,
                fetch_entries: flags.get("--fetch-entries", 1)?,
            };
            let delay = Duration::from_millis(flags.get("--replication-delay-ms", 0)?);
            let report = produce_latency::run(&config).await?;
            println!(
                "produce-latency: {} requests on {} connection(s), acks={}, {} errors, {:.2} s",
                config.requests,
                config.connections,
                if acks == -1 { "all" } else { "1" },
                report.errors,
                report.elapsed.as_secs_f64()
            );
            if config.parked_fetches > 0 {
                println!(
                    "  while {} fetches naming the partition {} times each waited",
                    config.parked_fetches, config.fetch_entries
                );
            }
            println!("  latency: {}", show(report.latency));
            if let Some(latency) = report.latency {
                println!(
                    "  minus the {} ms replication delay: p50 {}, p99 {}, max {}",
                    delay.as_millis(),
                    ms(latency.p50.saturating_sub(delay)),
                    ms(latency.p99.saturating_sub(delay)),
                    ms(latency.max.saturating_sub(delay))
                );
            }
        }
        "fetch-wakeup" => {
            let config = fetch_wakeup::FetchWakeupConfig {
                broker,
                topic,
                partition,
                rounds: flags.get("--rounds", 500)?,
                max_wait_ms: flags.get("--max-wait-ms", 10_000)?,
                park_time: Duration::from_millis(flags.get("--park-ms", 5)?),
            };
            let report = fetch_wakeup::run(&config).await?;
            println!(
                "fetch-wakeup: {} rounds, {} empty answers",
                config.rounds, report.empty_answers
            );
            println!("  produce sent -> fetch answered: {}", show(report.wakeup));
            println!("  produce (acks=1) itself:        {}", show(report.produce));
            println!(
                "  produce answered -> fetch answered: {}",
                show(report.after_ack)
            );
        }
        "idle-polls" => {
            let config = idle_polls::IdlePollsConfig {
                broker,
                broker_pid: flags
                    .get("--broker-pid", 0u32)
                    .map(|pid| (pid != 0).then_some(pid))?,
                topic,
                partition,
                connections: flags.get("--connections", 10_000)?,
                max_wait_ms: flags.get("--max-wait-ms", 60_000)?,
                idle: Duration::from_secs(flags.get("--idle-s", 10)?),
            };
            let report = idle_polls::run(&config).await?;
            println!(
                "idle-polls: {} long polls parked (max_wait {} ms)",
                report.parked, config.max_wait_ms
            );
            if let Some(usage) = report.usage {
                let mib = |kib: u64| kib as f64 / 1024.0;
                println!(
                    "  broker RSS: {:.1} MiB before, {:.1} MiB with all parked ({:.2} KiB per poll), \
                     {:.1}..{:.1} MiB over the {} s idle window",
                    mib(usage.before.rss_kib),
                    mib(usage.parked.rss_kib),
                    usage.parked.rss_kib.saturating_sub(usage.before.rss_kib) as f64
                        / report.parked.max(1) as f64,
                    mib(usage.rss_range_kib.0),
                    mib(usage.rss_range_kib.1),
                    report.idle.as_secs()
                );
                println!(
                    "  broker CPU during the idle window: {:.2} s ({:.2} % of one core; \
                     /proc counts in 10 ms ticks)",
                    usage.idle_cpu.as_secs_f64(),
                    100.0 * usage.idle_cpu.as_secs_f64() / report.idle.as_secs_f64().max(1e-9)
                );
            }
            println!(
                "  one produce -> every poll answered: {}",
                show(report.wakeup)
            );
            if report.unanswered > 0 {
                return Err(RunError::Failed(format!(
                    "{} polls never answered",
                    report.unanswered
                )));
            }
        }
        "left-polls" => {
            let config = left_polls::LeftPollsConfig {
                broker,
                broker_pid: match flags.get("--broker-pid", 0u32)? {
                    0 => return Err(RunError::Usage("left-polls needs --broker-pid".into())),
                    pid => pid,
                },
                topic,
                partition,
                connections: flags.get("--connections", 5_000)?,
            };
            let report = left_polls::run(&config).await?;
            let show = |s: &left_polls::Snapshot| {
                format!(
                    "{} descriptors, RSS {:.1} MiB",
                    s.open_files,
                    s.usage.rss_kib as f64 / 1024.0
                )
            };
            println!(
                "left-polls: {} long polls (max_wait 2^31-1 ms) whose clients then left",
                config.connections
            );
            println!("  before:              {}", show(&report.before));
            println!("  all parked:          {}", show(&report.parked));
            match report.returned_after {
                Some(after) => println!(
                    "  descriptors back after {:.0} ms: {}",
                    after.as_secs_f64() * 1e3,
                    show(&report.returned)
                ),
                None => println!("  not back within the limit: {}", show(&report.returned)),
            }
            println!("  1 s after they left: {}", show(&report.one_second_after));
            if report.returned_after.is_none() {
                return Err(RunError::Failed("the descriptors did not come back".into()));
            }
        }
        "hostile" => {
            let pid = match flags.get("--broker-pid", 0u32)? {
                0 => return Err(RunError::Usage("hostile needs --broker-pid".into())),
                pid => pid,
            };
            let name: String = flags.get("--scenario", String::new())?;
            let names: usize = flags.get("--names", 3000)?;
            let mib: usize = flags.get("--mib", 90)?;
            let Some(scenario) = hostile::Scenario::named(&name, names, mib) else {
                return Err(RunError::Usage(format!(
                    "--scenario {name:?}: see the list"
                )));
            };
            let connections: usize = flags.get("--connections", 100)?;
            let report = hostile::run(broker, pid, scenario, connections).await?;
            let mib = |kib: u64| kib as f64 / 1024.0;
            let grown = report.held.rss_kib.saturating_sub(report.before.rss_kib);
            println!("hostile {name}: {connections} clients, each staying connected");
            println!(
                "  broker before: RSS {:.1} MiB, {} descriptors",
                mib(report.before.rss_kib),
                report.before_files
            );
            println!(
                "  2 s after the last: RSS {:.1} MiB, {} descriptors; {} connection(s) closed by the broker",
                mib(report.held.rss_kib),
                report.held_files,
                report.closed_by_broker
            );
            println!(
                "  held per connection: {:.1} KiB ({:.2} MiB); per connection still open: {:.1} KiB",
                grown as f64 / connections.max(1) as f64,
                mib(grown) / connections.max(1) as f64,
                grown as f64 / (connections - report.closed_by_broker).max(1) as f64
            );
            println!(
                "  1 s after they left: RSS {:.1} MiB",
                mib(report.after.rss_kib)
            );
        }
        "flood" => {
            let config = flood::FloodConfig {
                broker,
                topic,
                partition,
                connections: flags.get("--connections", 10_000)?,
                fetch_entries: flags.get("--fetch-entries", 6)?,
                producers: flags.get("--producers", 8)?,
                flood: Duration::from_secs(flags.get("--flood-s", 20)?),
                record_bytes: flags.get("--record-bytes", 10)?,
                good_interval: Duration::from_millis(100),
                good_timeout_ms: flags.get("--timeout-ms", 5_000)?,
                catch_up_limit: Duration::from_secs(flags.get("--catch-up-s", 300)?),
            };
            let report = flood::run(&config).await?;
            println!(
                "flood: {} polls (each naming the partition {} times) parked; {} connections sent \
                 {} acks=0 produces in {} s ({:.0}/s)",
                config.connections,
                config.fetch_entries,
                config.producers,
                report.flooded,
                config.flood.as_secs(),
                report.flooded as f64 / config.flood.as_secs_f64().max(1e-9)
            );
            println!(
                "  good acks=all produces during the flood: {} acknowledged, {}; {} failed",
                report.good.map_or(0, |s| s.count),
                show(report.good),
                report.good_failed
            );
            match report.caught_up_after {
                Some(after) => println!(
                    "  high watermark caught up {:.0} ms after the flood",
                    after.as_secs_f64() * 1e3
                ),
                None => println!(
                    "  high watermark not caught up {} s after the flood",
                    config.catch_up_limit.as_secs()
                ),
            }
        }
        "timer-jitter" => {
            let sleep = Duration::from_millis(flags.get("--sleep-ms", 50)?);
            let samples: usize = flags.get("--samples", 200)?;
            let summary = tokio::task::spawn_blocking(move || timer_jitter::run(sleep, samples))
                .await
                .map_err(|e| RunError::Failed(e.to_string()))?;
            println!(
                "timer-jitter: {samples} sleeps of {} ms woke late by {}",
                sleep.as_millis(),
                show(summary)
            );
        }
        other => return Err(RunError::Usage(format!("unknown command {other:?}"))),
    }
    Ok(())
}
