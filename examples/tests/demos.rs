//! Runs the two small example binaries as a user would and checks what they print.

use std::process::Command;
use std::time::Duration;

fn run(binary: &str, args: &[&str]) -> String {
    let output = Command::new(binary)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {binary}: {e}"));
    assert!(output.status.success(), "{binary} failed: {output:?}");
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn delayed_produce_acknowledges_then_times_out() {
    let printed = run(
        env!("CARGO_BIN_EXE_delayed_produce"),
        &["--lag-ms", "20", "--timeout-ms", "100", "--requests", "3"],
    );
    let acknowledged = printed
        .matches("acknowledged by every in-sync follower")
        .count();
    let timed_out = printed.matches("answered \"request timed out\"").count();
    assert_eq!((acknowledged, timed_out), (3, 3), "{printed}");
    assert!(
        printed.contains("3 completed by follower progress, 0 expired"),
        "{printed}"
    );
    assert!(
        printed.contains("0 completed by follower progress, 3 expired"),
        "{printed}"
    );
}

#[test]
fn delayed_fetch_answers_on_bytes_or_at_max_wait() {
    let started = std::time::Instant::now();
    let printed = run(
        env!("CARGO_BIN_EXE_delayed_fetch"),
        &["--max-wait-ms", "300", "--append-interval-ms", "20"],
    );
    assert_eq!(
        printed.matches("because min_bytes reached").count(),
        2,
        "{printed}"
    );
    assert_eq!(
        printed.matches("because max_wait passed").count(),
        1,
        "{printed}"
    );
    assert!(started.elapsed() < Duration::from_secs(60));
}

#[test]
fn bad_flags_are_refused_with_usage() {
    for binary in [
        env!("CARGO_BIN_EXE_delayed_produce"),
        env!("CARGO_BIN_EXE_delayed_fetch"),
        env!("CARGO_BIN_EXE_broker"),
    ] {
        let output = Command::new(binary).arg("--bogus").output().unwrap();
        assert_eq!(output.status.code(), Some(2), "{binary}");
        assert!(String::from_utf8_lossy(&output.stderr).contains("usage:"));
    }
}
