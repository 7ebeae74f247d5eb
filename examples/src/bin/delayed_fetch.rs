//! `delayed_fetch`: long-poll fetches held in the purgatory until `min_bytes` are there, or
//! answered at `max_wait` with whatever is there. The logic lives in
//! `purgatory_examples::demo_fetch`.

use std::process::ExitCode;
use std::time::Duration;

use purgatory_examples::cli::{FlagError, Flags};
use purgatory_examples::demo_fetch::{default_scenarios, run};

const USAGE: &str = "usage: delayed_fetch [--max-wait-ms W] [--append-interval-ms I]
Parks three fetches on an empty partition (min_bytes 1, 500 and 1 MiB; max_wait W, default
1000) while a writer appends a batch every I ms (default 50), and prints how each was answered.";

fn main() -> ExitCode {
    let parsed = Flags::parse(
        std::env::args().skip(1),
        &["--max-wait-ms", "--append-interval-ms"],
        &[],
    )
    .and_then(|flags| {
        Ok((
            Duration::from_millis(flags.get("--max-wait-ms", 1000u64)?),
            Duration::from_millis(flags.get("--append-interval-ms", 50u64)?),
        ))
    });
    let (max_wait, interval) = match parsed {
        Ok(values) => values,
        Err(FlagError::HelpRequested) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("delayed_fetch: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(
        &default_scenarios(max_wait, interval),
        &mut std::io::stdout(),
    ) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("delayed_fetch: {e}");
            ExitCode::FAILURE
        }
    }
}
