//! Runs the built `purgatory-perf` binary with tiny parameters: every subcommand's
//! `--json` line parses and its counts add up, and bad arguments fail with a message.
//! No timing is asserted (speed is what the tool measures, not what it tests).

use std::process::{Command, Output};

use serde_json::Value;

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_purgatory-perf"))
        .args(args)
        .output()
        .expect("the binary runs")
}

/// Runs a successful command and returns its last stdout line as JSON.
fn json(args: &[&str]) -> Value {
    json_and_stderr(args).0
}

/// Runs a successful command and returns its last stdout line as JSON, and its stderr.
fn json_and_stderr(args: &[&str]) -> (Value, String) {
    let out = run(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{args:?} failed: {stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().expect("some output");
    let v = serde_json::from_str(last)
        .unwrap_or_else(|e| panic!("last line is not JSON ({e}): {last}"));
    (v, stderr)
}

fn results(v: &Value) -> &Vec<Value> {
    v["results"].as_array().expect("results array")
}

fn num(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} missing in {v}"))
}

#[test]
fn w1_counts_add_up_for_every_implementation() {
    let v = json(&["w1", "--tasks", "2000", "--json"]);
    let impls: Vec<_> = results(&v)
        .iter()
        .map(|r| r["impl"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(impls, ["ours", "binaryheap", "btreemap", "delayqueue"]);
    for r in results(&v) {
        assert_eq!(num(r, "cancelled"), 1800.0, "{r}");
        assert_eq!(num(r, "pending_end"), 2000.0 - 1800.0 + 2000.0, "{r}");
        assert!(num(r, "add_ns") > 0.0);
    }
    assert!(v["ratio_to_ours"]["btreemap"]["add_ns"].is_number());
}

#[test]
fn w1_diagnostic_implementations_account_for_every_task() {
    let v = json(&[
        "w1",
        "--tasks",
        "2000",
        "--impl",
        "ours,wheel,locked-wheel,ours-batch",
        "--json",
    ]);
    assert_eq!(results(&v).len(), 4);
    for r in results(&v) {
        assert_eq!(num(r, "cancelled"), 1800.0, "{r}");
        assert_eq!(num(r, "pending_end"), 2000.0 - 1800.0 + 2000.0, "{r}");
    }
}

#[test]
fn w1_mt_reports_speedup() {
    let v = json(&[
        "w1",
        "--tasks",
        "2000",
        "--threads",
        "2",
        "--impl",
        "ours,binaryheap",
        "--json",
    ]);
    for r in results(&v) {
        assert_eq!(num(r, "threads"), 2.0);
        assert_eq!(num(r, "cancelled"), 1800.0);
        assert_eq!(num(r, "pending_end"), 2200.0);
        assert!(num(r, "speedup_add") > 0.0);
    }
}

#[test]
fn w2_fires_everything_and_ours_never_early() {
    let v = json(&["w2", "--tasks", "2000", "--max-deadline-ms", "50", "--json"]);
    assert_eq!(results(&v).len(), 3);
    for r in results(&v) {
        assert_eq!(num(r, "fired"), 2000.0, "{r}");
        // Nested figures are flattened to dotted names in the summary.
        assert_eq!(num(r, "lateness.count"), 2000.0, "{r}");
    }
    let ours = &results(&v)[0];
    assert_eq!(ours["impl"], "ours");
    assert!(
        num(ours, "lateness.min_ms") >= 0.0,
        "ours fired early: {ours}"
    );
}

#[test]
fn w3_and_w3_events_account_for_every_request() {
    // The defaults (ours, naive), then the two tokio peers.
    for impls in [&[][..], &["--impl", "tokio-task,tokio-delayqueue"][..]] {
        for extra in [
            &[][..],
            &["--events", "--keys", "1", "--key-space-size", "1000"][..],
        ] {
            w3_accounts_for_every_request(impls, extra);
        }
    }
}

fn w3_accounts_for_every_request(impls: &[&str], extra: &[&str]) {
    let mut args = vec!["w3", "--num", "3000", "--rate", "100000", "--json"];
    args.extend_from_slice(impls);
    args.extend_from_slice(extra);
    let v = json(&args);
    assert_eq!(results(&v).len(), 2);
    for r in results(&v) {
        for key in [
            "elapsed_ms",
            "target_rate",
            "actual_rate",
            "cpu_ms",
            "peak_rss_bytes",
            "expiry_late_p50_ms",
            "expiry_late_p99_ms",
            "expiry_late_max_ms",
        ] {
            assert!(r[key].is_number(), "{key} missing in {r}");
        }
        assert_eq!(
            num(r, "completed") + num(r, "expired"),
            3000.0,
            "{args:?}: {r}"
        );
        assert!(num(r, "expired") > 0.0, "some latencies exceed the timeout");
        assert!(r["impl"].is_string());
    }
}

/// A W3-max search small enough for a test: 1,000 requests with a 20 ms timeout,
/// starting at 4,000,000/s.
const TINY_SWEEP: [&str; 12] = [
    "w3",
    "--num",
    "1000",
    "--rate",
    "4000000",
    "--timeout",
    "20",
    "--pct50",
    "2",
    "--pct75",
    "6",
    "--find-max",
];

#[test]
fn w3_find_max_reports_a_rate() {
    let mut args = TINY_SWEEP.to_vec();
    args.extend(["--impl", "naive", "--json"]);
    let v = json(&args);
    assert_eq!(v["workload"], "w3-max");
    assert_eq!(num(&v, "max_late_p99_ms"), 10.0, "on time is the default");
    let r = &results(&v)[0];
    assert!(r["max_rate_held"].is_number());
    assert!(!r["attempts"].as_array().unwrap().is_empty());
    // The on-time rate is never above the plain one (a rate held on time is held).
    assert!(num(&r["on_time"], "max_rate_held") <= num(r, "max_rate_held"));
}

/// Each rate is decided by a majority of `--attempts` (3 by default): a rate tried is
/// tried two or three times, and the knee says how many of its attempts held.
#[test]
fn w3_find_max_decides_each_rate_by_a_majority_of_attempts() {
    let mut args = TINY_SWEEP.to_vec();
    args.extend(["--impl", "null", "--plain", "--json"]);
    let v = json(&args);
    assert_eq!(num(&v, "attempts_per_rate"), 3.0, "{v}");
    let r = &results(&v)[0];
    let mut per_rate = std::collections::BTreeMap::<u64, usize>::new();
    for a in r["attempts"].as_array().expect("attempts") {
        *per_rate.entry(num(a, "target_rate") as u64).or_default() += 1;
    }
    assert!(
        per_rate.values().all(|&n| n == 2 || n == 3),
        "two or three attempts a rate: {per_rate:?}"
    );
    if num(r, "max_rate_held") > 0.0 {
        let (held, of) = (num(r, "held_at_max_rate"), num(r, "attempts_at_max_rate"));
        assert!(held >= 2.0 && held <= of && of <= 3.0, "{r}");
        assert_eq!(
            per_rate[&(num(r, "max_rate_held") as u64)] as f64,
            of,
            "{r}"
        );
    }
    // --attempts 1: one attempt a rate.
    let mut args = TINY_SWEEP.to_vec();
    args.extend(["--impl", "null", "--plain", "--json", "--attempts", "1"]);
    let v = json(&args);
    let r = &results(&v)[0];
    let rates: Vec<f64> = r["attempts"]
        .as_array()
        .expect("attempts")
        .iter()
        .map(|a| num(a, "target_rate"))
        .collect();
    let mut distinct = rates.clone();
    distinct.dedup();
    assert_eq!(rates, distinct, "one attempt a rate");
}

/// `null-late` keeps up with any rate (it does no work) but answers every expiry 50 ms
/// after its deadline: held plainly, never on time. The searches start at 8,000/s, so
/// the on-time one halves to the lowest rate in three attempts.
#[test]
fn w3_find_max_does_not_count_late_expiries_as_held() {
    let late_sweep = |extra: &[&'static str]| {
        let mut args = TINY_SWEEP.to_vec();
        assert_eq!(args[3], "--rate");
        args[4] = "8000";
        args.extend(["--impl", "null-late", "--json"]);
        args.extend_from_slice(extra);
        args
    };
    let (v, stderr) = json_and_stderr(&late_sweep(&["--max-late-p99-ms", "10"]));
    assert!(
        stderr.contains("held, LATE (p99 over 10 ms; the machine stalled the process"),
        "a late attempt's line says so, with the machine's stalls: {stderr}"
    );
    let r = &results(&v)[0];
    assert_eq!(
        num(&r["on_time"], "max_rate_held"),
        0.0,
        "a rate whose expiries are 50 ms late was counted as held on time: {r}"
    );
    assert!(r["on_time"]["at_max_rate_held"].is_null(), "{r}");
    assert!(num(r, "max_rate_held") > 0.0, "it keeps up: {r}");
    assert!(
        num(&r["at_max_rate_held"], "expiry_late_p99_ms") >= 50.0,
        "{r}"
    );
    for a in r["attempts"].as_array().expect("attempts") {
        assert_eq!(a["on_time"], false, "{a}");
        assert!(num(&a["result"], "expiry_late_p99_ms") >= 50.0, "{a}");
    }
    // With a bound it meets, the same target is held on time.
    let v = json(&late_sweep(&["--max-late-p99-ms", "1000"]));
    let r = &results(&v)[0];
    assert!(num(&r["on_time"], "max_rate_held") > 0.0, "{r}");
    // --plain searches the plain rate alone.
    let v = json(&late_sweep(&["--plain"]));
    assert!(v["max_late_p99_ms"].is_null());
    let r = &results(&v)[0];
    assert!(r["on_time"].is_null(), "{r}");
    assert!(num(r, "max_rate_held") > 0.0, "{r}");
}

#[test]
fn w3_find_max_draws_the_sweep() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let svg = dir.join(format!("w3-sweep-{}.svg", std::process::id()));
    let _ = std::fs::remove_file(&svg);
    let impls = ["ours", "naive", "tokio-task", "tokio-delayqueue"];
    let joined = impls.join(",");
    // A bound every implementation meets at these sizes, so that the plain search finds
    // its attempts made (the late fixture tests the bound).
    let mut args = TINY_SWEEP.to_vec();
    args.extend([
        "--impl",
        &joined,
        "--max-late-p99-ms",
        "1000",
        "--json",
        "--plot",
    ]);
    args.push(svg.to_str().expect("a UTF-8 temp path"));
    let v = json(&args);
    assert_eq!(results(&v).len(), impls.len());
    let text = std::fs::read_to_string(&svg).expect("the SVG was written");
    let _ = std::fs::remove_file(&svg);
    assert!(text.contains("<svg"), "not an SVG: {text:.200}");
    for name in impls {
        assert!(text.contains(name), "{name} is not in the picture");
    }
    assert!(
        text.contains("on time"),
        "the on-time knees are not in the legend"
    );
}

#[test]
fn bad_arguments_fail_with_a_message() {
    let cases: &[(&[&str], &str)] = &[
        (&["w3", "--rate", "-5"], "--rate"),
        (&["w3", "--pct50", "50", "--pct75", "20"], "--pct75"),
        (&["w3", "--timeout", "0"], "--timeout"),
        (
            &["w3", "--keys", "5", "--key-space-size", "3"],
            "--key-space-size",
        ),
        (&["w1", "--impl", "ours,fast"], "unknown implementation"),
        (&["w3", "--impl", "btreemap"], "unknown implementation"),
        (&["w3", "--plot", "x.svg"], "--find-max"),
        (&["w3", "--max-late-p99-ms", "10"], "--find-max"),
        (
            &["w3", "--find-max", "--max-late-p99-ms", "-1"],
            "at least 0",
        ),
        (
            &["w3", "--find-max", "--max-late-p99-ms", "NaN"],
            "at least 0",
        ),
        (
            &["w3", "--find-max", "--plain", "--max-late-p99-ms", "5"],
            "cannot be used with",
        ),
        (&["w3", "--find-max", "--runs", "3"], "--runs"),
        (
            &["w3", "--find-max", "--attempts", "2"],
            "odd number of attempts",
        ),
        (
            &["w3", "--find-max", "--attempts", "0"],
            "odd number of attempts",
        ),
        (&["w3", "--attempts", "3"], "--find-max"),
        (&["w3", "--events", "--impl", "null-late"], "null-late"),
        (&["w1", "--tasks", "many"], "--tasks"),
        (&["w1", "--threads", "0"], "--threads"),
        (
            &[
                "w1",
                "--impl",
                "locked-wheel",
                "--threads",
                "2",
                "--tasks",
                "2000",
            ],
            "single-threaded",
        ),
        (
            &["w1", "--impl", "wheel", "--threads", "2", "--tasks", "2000"],
            "single-threaded",
        ),
        (
            &[
                "w1",
                "--impl",
                "ours-batch",
                "--threads",
                "2",
                "--tasks",
                "2000",
            ],
            "single-threaded",
        ),
        (&["w9"], "unrecognized subcommand"),
        (&["--child", "{not json"], "bad child job"),
    ];
    for (args, expected) in cases {
        let out = run(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(
            stderr.contains(expected),
            "{args:?}: stderr lacks `{expected}`: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
    }
}

#[test]
fn help_succeeds() {
    let out = run(&["--help"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("w3"));
}
