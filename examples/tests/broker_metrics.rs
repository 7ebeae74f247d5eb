//! `broker --metrics-listen`: the binary serves the purgatories' figures as Prometheus
//! text. One acks=all produce parks in the produce purgatory and completes when the
//! follower copies it; the endpoint then shows it. Loopback only; every wait bounded.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use purgatory_examples::record_batch::encode_batch;
use purgatory_examples::wire_client::{requests, WireClient};

const LIMIT: Duration = Duration::from_secs(20);

/// The broker process, killed when the test ends however it ends.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the broker binary on free loopback ports; returns it with its Kafka and
/// metrics addresses, read from what it prints.
fn start_broker() -> (Running, SocketAddr, SocketAddr) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_broker"));
    command.args(["--followers", "1", "--replication-delay-ms", "30"]);
    start_with(command)
}

/// Starts `command` (the broker binary and flags, or a shell starting it) on free loopback
/// ports with the metrics endpoint.
fn start_with(mut command: Command) -> (Running, SocketAddr, SocketAddr) {
    let mut child = command
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("the broker binary starts");
    let stdout = child.stdout.take().unwrap();
    let running = Running(child);
    let (lines, printed) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let address = |line: &str, prefix: &str| -> Option<SocketAddr> {
        let rest = line.strip_prefix(prefix)?;
        rest.split(['/', ' ']).next()?.parse().ok()
    };
    let (mut kafka, mut metrics) = (None, None);
    let deadline = Instant::now() + LIMIT;
    while kafka.is_none() || metrics.is_none() {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = printed
            .recv_timeout(left)
            .expect("the broker prints both addresses");
        kafka = kafka.or(address(&line, "broker listening on "));
        metrics = metrics.or(address(&line, "metrics on http://"));
    }
    (running, kafka.unwrap(), metrics.unwrap())
}

/// One HTTP/1.0 GET of the metrics text.
fn scrape(addr: SocketAddr) -> String {
    let mut stream = TcpStream::connect_timeout(&addr, LIMIT).unwrap();
    stream.set_read_timeout(Some(LIMIT)).unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").expect("an HTTP answer");
    assert!(head.starts_with("HTTP/1.0 200"), "{head}");
    assert!(head.contains("Content-Type: text/plain"), "{head}");
    body.to_string()
}

/// The value of the sample `name{purgatory="which"}` in the text, if there.
fn sample(text: &str, name: &str, which: &str) -> Option<f64> {
    let series = format!("{name}{{purgatory=\"{which}\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&series))
        .and_then(|value| value.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_endpoint_shows_a_produce_parked_then_completed() {
    let (_broker, kafka, metrics) = start_broker();

    // acks=all: the produce waits in the purgatory until the follower copies it.
    let mut client = tokio::time::timeout(LIMIT, WireClient::connect(kafka))
        .await
        .unwrap()
        .unwrap();
    let batch = encode_batch(&[Bytes::from_static(b"watched")], 1_000);
    let produce = requests::produce("demo", 0, -1, 10_000, batch);
    let sent = Instant::now();
    let answer = tokio::time::timeout(LIMIT, client.call(3, &produce))
        .await
        .expect("the produce is answered")
        .unwrap();
    assert_eq!(answer.responses[0].partition_responses[0].error_code, 0);
    assert!(
        sent.elapsed() >= Duration::from_millis(20),
        "answered before the follower (30 ms behind) could copy it: it never waited"
    );

    // The reaper publishes about once a second; the endpoint shows what it published.
    let deadline = Instant::now() + LIMIT;
    let text = loop {
        let text = tokio::task::spawn_blocking(move || scrape(metrics))
            .await
            .unwrap();
        let completed = sample(&text, "purgatory_completed_total", "produce");
        let pending = sample(&text, "purgatory_pending", "produce");
        if completed == Some(1.0) && pending == Some(0.0) {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "the produce's completion never showed:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        sample(&text, "purgatory_expired_total", "produce"),
        Some(0.0)
    );
    // The fetch purgatory publishes its figures too, and the types are declared.
    assert_eq!(sample(&text, "purgatory_pending", "fetch"), Some(0.0));
    assert!(text.contains("# TYPE purgatory_watched gauge"), "{text}");
    assert!(
        text.contains("# TYPE purgatory_completed_total counter"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_metrics_connections_beyond_the_cap_do_not_starve_kafka_clients() {
    const IDLE: usize = 150;
    // Under `ulimit -n 128`: 64 Kafka connections at most by default, 16 metrics ones.
    let mut command = Command::new("sh");
    command.args([
        "-c",
        "ulimit -n 128 && exec \"$0\" \"$@\"",
        env!("CARGO_BIN_EXE_broker"),
        "--followers",
        "0",
    ]);
    let (_running, kafka, metrics) = start_with(command);
    // 150 connections to the metrics port that never send a request.
    let mut idle = Vec::with_capacity(IDLE);
    for _ in 0..IDLE {
        match TcpStream::connect_timeout(&metrics, LIMIT) {
            Ok(stream) => idle.push(stream),
            Err(e) => panic!("connect to the metrics port: {e}"),
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    let mut client = tokio::time::timeout(LIMIT, WireClient::connect(kafka))
        .await
        .unwrap()
        .unwrap();
    let answer = tokio::time::timeout(
        LIMIT,
        client.call(1, &kafka_protocol::messages::MetadataRequest::default()),
    )
    .await
    .expect("a Kafka client was not answered while the metrics port was flooded")
    .unwrap();
    let waited = started.elapsed();
    eprintln!("150 idle metrics connections: a Kafka client was served in {waited:?}");
    assert_eq!(answer.brokers.len(), 1);
    assert!(
        waited < Duration::from_millis(200),
        "a Kafka client waited {waited:?}"
    );
    // Those beyond the cap were closed at once: a read sees the end of stream.
    let mut closed = 0;
    for stream in &mut idle {
        stream
            .set_read_timeout(Some(Duration::from_millis(20)))
            .unwrap();
        let seen = stream.read(&mut [0u8; 1]);
        let reset = |e: &std::io::Error| e.kind() == std::io::ErrorKind::ConnectionReset;
        if matches!(seen, Ok(0)) || seen.as_ref().is_err_and(reset) {
            closed += 1;
        }
    }
    assert!(
        closed >= IDLE - 16 - 10,
        "{closed} of {IDLE} idle metrics connections closed"
    );
    // The metrics port still answers once the idle ones are gone.
    drop(idle);
    std::thread::sleep(Duration::from_millis(100));
    assert!(scrape(metrics).contains("purgatory_pending"));
}
