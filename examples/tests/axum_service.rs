//! The axum example service end to end, in this process, over real HTTP on loopback:
//! a shutdown answers every parked long poll 503 at once and the server ends; clients
//! that leave cancel their operations one for one; the purgatories' Prometheus counters
//! equal what the clients counted; a produce waits for its follower acks (200) or its
//! timeout (408). And the natural shutdown order, for contrast, waits out a parked poll.
//!
//! The client is hyper's low-level one: one connection per request, driven inside the
//! request's future, so that aborting the task that runs it closes the socket (a client
//! that leaves). Waits for the server to catch up are generous (this runs on a loaded
//! 2-core machine); counts are exact.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use purgatory_examples::axum_service::metrics::install_prometheus;
use purgatory_examples::axum_service::{router, serve, Config, Service};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The longest any wait for the server may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(20);
/// The target: the last parked request answered this soon after the signal.
const SHUTDOWN_TARGET: Duration = Duration::from_millis(100);

/// A service serving on a free loopback port, until `stop`.
struct Running {
    addr: SocketAddr,
    service: Service,
    signal: Option<oneshot::Sender<()>>,
    server: JoinHandle<std::io::Result<()>>,
}

impl Running {
    async fn start(config: Config) -> Running {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let service = Service::new(config);
        let (signal, signalled) = oneshot::channel::<()>();
        let shutdown = async move {
            let _ = signalled.await;
        };
        let server = tokio::spawn(serve(listener, service.clone(), shutdown));
        Running {
            addr,
            service,
            signal: Some(signal),
            server,
        }
    }

    /// Sends the shutdown signal; returns when it was sent.
    fn signal(&mut self) -> Instant {
        let sent = Instant::now();
        self.signal.take().unwrap().send(()).unwrap();
        sent
    }

    /// Waits for the server task to end; returns when it did.
    async fn ended(self) -> Instant {
        tokio::time::timeout(PATIENCE, self.server)
            .await
            .expect("the server ends")
            .unwrap()
            .unwrap();
        Instant::now()
    }
}

/// An HTTP answer, and when its head arrived.
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    body: String,
    at: Instant,
}

/// One request on a connection of its own, driven here: dropping this future (aborting
/// its task) closes the socket.
async fn request(addr: SocketAddr, method: Method, path: String) -> Answer {
    let stream = TcpStream::connect(addr).await.expect("connects");
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header(hyper::header::HOST, addr.to_string())
        .body(Empty::<Bytes>::new())
        .unwrap();
    let exchange = async move {
        let response = sender.send_request(request).await.expect("an answer");
        let at = Instant::now();
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let body = String::from_utf8(body.to_vec()).unwrap();
        // `sender` drops here: the connection then ends.
        Answer { status, body, at }
    };
    let (answer, _connection) = tokio::join!(exchange, connection);
    answer
}

fn spawn_get(addr: SocketAddr, path: String) -> JoinHandle<Answer> {
    tokio::spawn(request(addr, Method::GET, path))
}

fn spawn_post(addr: SocketAddr, path: String) -> JoinHandle<Answer> {
    tokio::spawn(request(addr, Method::POST, path))
}

/// Waits until `done` holds, checking every few milliseconds, for at most `PATIENCE`.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !done() {
        assert!(Instant::now() < deadline, "still waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The answers of `tasks`, in order.
async fn answers(tasks: Vec<JoinHandle<Answer>>) -> Vec<Answer> {
    let mut answers = Vec::with_capacity(tasks.len());
    for task in tasks {
        let answer = tokio::time::timeout(PATIENCE, task).await;
        answers.push(answer.expect("answered in time").expect("the client ran"));
    }
    answers
}

fn statuses(answers: &[Answer]) -> Vec<u16> {
    answers.iter().map(|a| a.status.as_u16()).collect()
}

/// How many of `answers` have `status`.
fn count(answers: &[Answer], status: StatusCode) -> u64 {
    answers.iter().filter(|a| a.status == status).count() as u64
}

/// The value of the sample `metric{purgatory="label"}` in Prometheus text.
fn sample(text: &str, metric: &str, label: &str) -> u64 {
    let name = format!("{metric}{{purgatory=\"{label}\"}} ");
    let line = text
        .lines()
        .find(|line| line.starts_with(&name))
        .unwrap_or_else(|| panic!("no {name} in\n{text}"));
    line[name.len()..].trim().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_answers_every_parked_poll_at_once() {
    const POLLS: usize = 200;
    let mut running = Running::start(Config::default()).await;
    let addr = running.addr;
    let polls: Vec<_> = (0..POLLS)
        .map(|_| spawn_get(addr, "/poll/idle?after=0&wait_ms=30000".into()))
        .collect();
    let service = running.service.clone();
    until("every poll parked", || service.polls().pending() == POLLS).await;

    let signalled = running.signal();
    let answers = answers(polls).await;
    let last = answers.iter().map(|a| a.at).max().unwrap() - signalled;
    let ended = running.ended().await - signalled;
    eprintln!(
        "shutdown: {POLLS} parked polls answered 503 within {:.1} ms of the signal, \
         server ended after {:.1} ms",
        last.as_secs_f64() * 1e3,
        ended.as_secs_f64() * 1e3
    );
    assert!(
        statuses(&answers).iter().all(|&s| s == 503),
        "{:?}",
        statuses(&answers)
    );
    let stats = service.polls().stats();
    assert_eq!(
        (stats.expired_at_shutdown, stats.expired),
        (POLLS as u64, 0)
    );
    assert!(last < SHUTDOWN_TARGET, "last 503 after {last:?}");
    assert!(
        ended < Duration::from_secs(2),
        "the server ended after {ended:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_leave_cancel_their_polls_one_for_one() {
    const LEAVING: usize = 30;
    const STAYING: usize = 20;
    let mut running = Running::start(Config::default()).await;
    let addr = running.addr;
    let mut polls: Vec<_> = (0..LEAVING + STAYING)
        .map(|_| spawn_get(addr, "/poll/left?wait_ms=30000".into()))
        .collect();
    let service = running.service.clone();
    until("every poll parked", || {
        service.polls().pending() == LEAVING + STAYING
    })
    .await;

    let staying = polls.split_off(LEAVING);
    for leaving in polls {
        leaving.abort(); // drops the request's future: its socket closes
    }
    until("the leavers' polls cancelled", || {
        service.polls().stats().cancelled >= LEAVING as u64
    })
    .await;
    // Settled: nothing else cancels or answers anything.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let stats = service.polls().stats();
    assert_eq!((stats.cancelled, stats.pending), (LEAVING as u64, STAYING));
    assert_eq!(
        stats.completed + stats.expired + stats.expired_at_shutdown,
        0
    );

    running.signal();
    let answers = answers(staying).await;
    assert!(
        statuses(&answers).iter().all(|&s| s == 503),
        "{:?}",
        statuses(&answers)
    );
    running.ended().await;
    let stats = service.polls().stats();
    assert_eq!(
        (stats.cancelled, stats.expired_at_shutdown),
        (LEAVING as u64, STAYING as u64)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_counters_equal_the_clients_tally() {
    let prometheus = install_prometheus().unwrap();
    let config = Config {
        followers: 2,
        replication_delay: Duration::from_millis(20),
        prometheus: Some(prometheus.clone()),
        ..Config::default()
    };
    let mut running = Running::start(config).await;
    let (addr, service) = (running.addr, running.service.clone());
    // Other tests' services in this process may publish as `poll` too.
    let (poll_label, produce_label) = (
        service.polls().metrics_label(),
        service.produces().metrics_label(),
    );
    let polls = service.polls().clone();
    let mut poll_answers = Vec::new();
    let mut produce_answers = Vec::new();

    // Polls that a produce answers (200), and one answered at once (200: already past).
    let waiting: Vec<_> = (0..40)
        .map(|_| spawn_get(addr, "/poll/news?after=0&wait_ms=30000".into()))
        .collect();
    until("the news polls parked", || polls.pending() == 40).await;
    produce_answers.extend(answers(vec![spawn_post(addr, "/produce/news?acks=0".into())]).await);
    poll_answers.extend(answers(waiting).await);
    poll_answers.extend(answers(vec![spawn_get(addr, "/poll/news?after=0".into())]).await);

    // Polls whose short wait passes (204).
    let expiring: Vec<_> = (0..25)
        .map(|_| spawn_get(addr, "/poll/quiet?wait_ms=50".into()))
        .collect();
    poll_answers.extend(answers(expiring).await);

    // Polls whose clients leave (cancelled), counted by the client as it leaves them.
    let leaving: Vec<_> = (0..15)
        .map(|_| spawn_get(addr, "/poll/gone?wait_ms=30000".into()))
        .collect();
    until("the leaving polls parked", || polls.pending() == 15).await;
    let disconnects = leaving.len() as u64;
    leaving.iter().for_each(JoinHandle::abort);
    until("the leavers' polls cancelled", || {
        polls.stats().cancelled >= disconnects
    })
    .await;

    // Produces acked by both followers (200).
    let acked: Vec<_> = (0..10)
        .map(|_| spawn_post(addr, "/produce/orders?acks=2&timeout_ms=20000".into()))
        .collect();
    produce_answers.extend(answers(acked).await);

    let scrape = answers(vec![spawn_get(addr, "/metrics".into())]).await;
    let text = &scrape[0].body;
    assert_eq!(scrape[0].status, StatusCode::OK);
    let polls_200 = count(&poll_answers, StatusCode::OK);
    let polls_204 = count(&poll_answers, StatusCode::NO_CONTENT);
    assert_eq!((polls_200, polls_204, poll_answers.len()), (41, 25, 66));
    assert_eq!(
        tally_of(text, &poll_label),
        [polls_200, polls_204, 0, disconnects]
    );
    // The acks=0 produce parks nothing; the ten acks=2 ones complete.
    let produced_200 = count(&produce_answers, StatusCode::OK);
    assert_eq!(produced_200, 11);
    assert_eq!(tally_of(text, &produce_label), [produced_200 - 1, 0, 0, 0]);

    // Polls parked when the service shuts down (503). The server is gone afterwards, so
    // the counters are read from the exporter's text: what `/metrics` would serve.
    let parked: Vec<_> = (0..12)
        .map(|_| spawn_get(addr, "/poll/quiet?after=0&wait_ms=30000".into()))
        .collect();
    until("the last polls parked", || polls.pending() == 12).await;
    running.signal();
    let at_shutdown = answers(parked).await;
    running.ended().await;
    let polls_503 = count(&at_shutdown, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(polls_503, 12);
    let text = prometheus.render();
    assert_eq!(
        tally_of(&text, &poll_label),
        [polls_200, polls_204, polls_503, disconnects]
    );
}

/// The four counters of `label` in `text`.
fn tally_of(text: &str, label: &str) -> [u64; 4] {
    [
        "purgatory_completed_total",
        "purgatory_expired_total",
        "purgatory_shutdown_expired_total",
        "purgatory_cancelled_total",
    ]
    .map(|metric| sample(text, metric, label))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_produce_waits_for_its_acks() {
    // Followers 20 ms behind: both acks come.
    let mut running = Running::start(Config {
        followers: 2,
        replication_delay: Duration::from_millis(20),
        ..Config::default()
    })
    .await;
    let addr = running.addr;
    let started = Instant::now();
    let acked = answers(vec![spawn_post(
        addr,
        "/produce/t?acks=2&timeout_ms=20000".into(),
    )])
    .await;
    assert_eq!(
        (acked[0].status, acked[0].body.trim()),
        (StatusCode::OK, "0")
    );
    assert!(
        started.elapsed() >= Duration::from_millis(20),
        "no sooner than the copies"
    );
    let refused = answers(vec![spawn_post(addr, "/produce/t?acks=3".into())]).await;
    assert_eq!(refused[0].status, StatusCode::BAD_REQUEST);
    running.signal();
    running.ended().await;

    // Followers a minute behind: the produce times out (408), or the shutdown answers it.
    let mut running = Running::start(Config {
        followers: 1,
        replication_delay: Duration::from_secs(60),
        ..Config::default()
    })
    .await;
    let addr = running.addr;
    let started = Instant::now();
    let late = answers(vec![spawn_post(
        addr,
        "/produce/t?acks=1&timeout_ms=200".into(),
    )])
    .await;
    assert_eq!(
        (late[0].status, late[0].body.as_str()),
        (StatusCode::REQUEST_TIMEOUT, "")
    );
    assert!(started.elapsed() >= Duration::from_millis(200));
    let parked = spawn_post(addr, "/produce/t?acks=1&timeout_ms=30000".into());
    let service = running.service.clone();
    until("the produce parked", || service.produces().pending() == 1).await;
    running.signal();
    let at_shutdown = answers(vec![parked]).await;
    assert_eq!(at_shutdown[0].status, StatusCode::SERVICE_UNAVAILABLE);
    running.ended().await;
    let stats = service.produces().stats();
    assert_eq!((stats.expired, stats.expired_at_shutdown), (1, 1));
}

/// The order `serve` avoids: hyper's graceful shutdown first, the purgatory after. The
/// parked poll is in flight, so hyper waits for it, and it waits for its own timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_natural_order_waits_out_parked_polls() {
    const WAIT: Duration = Duration::from_millis(1000);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let service = Service::new(Config::default());
    let (signal, signalled) = oneshot::channel::<()>();
    let app = router(service.clone());
    let server = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = signalled.await;
            })
            .await
    });
    let sent = Instant::now();
    let poll = spawn_get(addr, format!("/poll/idle?wait_ms={}", WAIT.as_millis()));
    until("the poll parked", || service.polls().pending() == 1).await;
    let signalled = Instant::now();
    signal.send(()).unwrap();
    tokio::time::timeout(PATIENCE, server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let ended = signalled.elapsed();
    service.shutdown().await;
    let answer = answers(vec![poll]).await;
    eprintln!("natural order: the server ended {ended:?} after the signal");
    // Answered by its timeout, not the shutdown; the server waited for it.
    assert_eq!(answer[0].status, StatusCode::NO_CONTENT);
    assert!(sent.elapsed() >= WAIT, "{ended:?}");
}
