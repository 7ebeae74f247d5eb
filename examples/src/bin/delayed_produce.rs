//! `delayed_produce`: acks=all produce requests held in the purgatory until the simulated
//! followers have copied them; then the same with followers lagging past the timeout.
//! The logic lives in `purgatory_examples::demo_produce`.

use std::process::ExitCode;
use std::time::Duration;

use purgatory_examples::cli::{FlagError, Flags};
use purgatory_examples::demo_produce::{run, ProduceDemoConfig};

const USAGE: &str = "usage: delayed_produce [--followers N] [--lag-ms D] [--timeout-ms T] \
[--requests N] [--records N]
Runs acks=all produce requests against one partition twice: with followers lagging D ms
(default 50; acknowledged after about D ms), then with followers lagging 3 x T ms
(default T = 500; every request answered \"request timed out\" after T ms).";

fn config() -> Result<ProduceDemoConfig, FlagError> {
    let flags = Flags::parse(
        std::env::args().skip(1),
        &[
            "--followers",
            "--lag-ms",
            "--timeout-ms",
            "--requests",
            "--records",
        ],
        &[],
    )?;
    let defaults = ProduceDemoConfig::default();
    Ok(ProduceDemoConfig {
        followers: flags.get("--followers", defaults.followers)?,
        lag: Duration::from_millis(flags.get("--lag-ms", 50u64)?),
        timeout: Duration::from_millis(flags.get("--timeout-ms", 500u64)?),
        requests: flags.get("--requests", defaults.requests)?,
        records_per_request: flags.get("--records", defaults.records_per_request)?,
        interval: defaults.interval,
    })
}

fn main() -> ExitCode {
    let healthy = match config() {
        Ok(config) => config,
        Err(FlagError::HelpRequested) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("delayed_produce: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let lagging = ProduceDemoConfig {
        lag: healthy.timeout * 3,
        ..healthy
    };
    let mut out = std::io::stdout();
    for config in [healthy, lagging] {
        if let Err(e) = run(&config, &mut out) {
            eprintln!("delayed_produce: {e}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
