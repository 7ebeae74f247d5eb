//! The coordinator example (`src/coordinator/`): both versions answer the same way at
//! every edge a client can reach (a heartbeat before joining, a member id out of range,
//! a second join, a group that never fills, a session that expires), and the binary's
//! side-by-side load runs end to end and checks its own figures (every dead member's
//! session expired, no live member refused).

use std::sync::Arc;
use std::time::Duration;

use purgatory_examples::coordinator::on_delay_queue::OnDelayQueue;
use purgatory_examples::coordinator::on_purgatory::OnPurgatory;
use purgatory_examples::coordinator::protocol::{NONE, REBALANCE_IN_PROGRESS, UNKNOWN_MEMBER_ID};
use purgatory_examples::coordinator::{Config, Coordinator};

fn config(session_ms: u64, rebalance_ms: u64) -> Config {
    Config {
        members: 7,
        group_size: 3,
        session_timeout: Duration::from_millis(session_ms),
        rebalance_timeout: Duration::from_millis(rebalance_ms),
    }
}

/// Runs `check` against each version, in a runtime of its own.
fn on_both(config: Config, check: impl Fn(Arc<dyn Coordinator>) -> futures_check::Check) {
    for purgatory in [true, false] {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let coordinator: Arc<dyn Coordinator> = if purgatory {
                Arc::new(OnPurgatory::new(config))
            } else {
                Arc::new(OnDelayQueue::new(config))
            };
            check(Arc::clone(&coordinator)).await;
            coordinator.shutdown().await;
        });
    }
}

mod futures_check {
    /// A boxed check.
    pub type Check = std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>;
}

#[test]
fn a_heartbeat_without_a_session_and_an_unknown_member_are_refused() {
    on_both(config(10_000, 10_000), |c| {
        Box::pin(async move {
            assert_eq!(c.heartbeat(0), UNKNOWN_MEMBER_ID, "never joined");
            assert_eq!(c.heartbeat(7), UNKNOWN_MEMBER_ID, "out of range");
            assert_eq!(c.heartbeat(u32::MAX), UNKNOWN_MEMBER_ID);
            assert_eq!(c.join(u32::MAX).await, UNKNOWN_MEMBER_ID);
            assert_eq!(c.stats().unknown, 3);
        })
    });
}

#[test]
fn a_full_group_opens_its_barrier_once_and_a_second_join_is_refused() {
    on_both(config(10_000, 10_000), |c| {
        Box::pin(async move {
            let joins: Vec<_> = (0..3).map(|m| c.join(m)).collect();
            assert_eq!(c.join(1).await, REBALANCE_IN_PROGRESS, "joined already");
            for join in joins {
                assert_eq!(join.await, NONE);
            }
            for m in 0..3 {
                assert_eq!(c.heartbeat(m), NONE);
            }
            assert_eq!(c.heartbeat(3), UNKNOWN_MEMBER_ID, "another group");
            // The last group is short (7 = 3 + 3 + 1): its one member opens it.
            assert_eq!(c.join(6).await, NONE);
        })
    });
}

#[test]
fn a_group_that_never_fills_times_out_its_joins() {
    on_both(config(10_000, 100), |c| {
        Box::pin(async move {
            let (a, b) = (c.join(3), c.join(4));
            assert_eq!(a.await, REBALANCE_IN_PROGRESS);
            assert_eq!(b.await, REBALANCE_IN_PROGRESS);
            assert_eq!(c.heartbeat(3), UNKNOWN_MEMBER_ID, "no session started");
        })
    });
}

#[test]
fn heartbeats_keep_a_session_and_it_expires_once_they_stop() {
    on_both(config(1_000, 10_000), |c| {
        Box::pin(async move {
            assert_eq!(c.join(6).await, NONE);
            for _ in 0..8 {
                tokio::time::sleep(Duration::from_millis(200)).await;
                assert_eq!(c.heartbeat(6), NONE, "alive while heartbeats come");
            }
            tokio::time::sleep(Duration::from_millis(2_500)).await;
            assert_eq!(c.heartbeat(6), UNKNOWN_MEMBER_ID, "expired");
            let stats = c.stats();
            assert_eq!(stats.expired, 1);
            // Answered at its deadline, not at a later look (the bound is loose: the
            // machine is shared; the load figures are the measure).
            assert!(
                stats.late_max_us < 500_000,
                "answered {} us after its deadline",
                stats.late_max_us
            );
        })
    });
}

#[test]
fn the_binary_loads_both_versions_and_checks_its_figures() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_coordinator"))
        .args([
            "--members",
            "1000",
            "--group-size",
            "50",
            "--rate",
            "1000",
            "--secs",
            "4",
            "--warm-secs",
            "1",
            "--rounds",
            "1",
            "--connections",
            "4",
            "--dead-every",
            "10",
            "--session-timeout-ms",
            "3000",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("expired 100/100"), "{stdout}");
    assert!(stdout.contains("purgatory / delay-queue:"), "{stdout}");
}

/// The server over TCP: a frame of an unknown kind closes its connection (and only it); a
/// join whose client left still counts toward its group's barrier.
#[test]
fn the_server_closes_a_garbled_connection_and_keeps_a_left_clients_join() {
    use purgatory_examples::coordinator::protocol::{self, HEARTBEAT, JOIN};
    use purgatory_examples::coordinator::server;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let coordinator: Arc<dyn Coordinator> = Arc::new(OnPurgatory::new(config(10_000, 10_000)));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = tokio::spawn(server::serve(listener, Arc::clone(&coordinator), async {
            let _ = stopped.await;
        }));
        // Garbage: the connection is closed, nothing answered.
        let mut garbled = tokio::net::TcpStream::connect(addr).await.unwrap();
        garbled.write_all(&[0xff; 5]).await.unwrap();
        let mut buf = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(5), garbled.read(&mut buf)).await;
        assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "closed: {read:?}");
        // Member 0 joins and leaves before its group fills.
        let mut left = tokio::net::TcpStream::connect(addr).await.unwrap();
        left.write_all(&protocol::request(JOIN, 0)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(left);
        // Members 1 and 2 fill the group on another connection: both answered NONE.
        let mut client = tokio::net::TcpStream::connect(addr).await.unwrap();
        for m in [1, 2] {
            client.write_all(&protocol::request(JOIN, m)).await.unwrap();
        }
        let mut answers = Vec::new();
        for _ in 0..2 {
            let mut frame = [0u8; protocol::ANSWER_LEN];
            tokio::time::timeout(Duration::from_secs(5), client.read_exact(&mut frame))
                .await
                .expect("the barrier opened")
                .unwrap();
            answers.push(protocol::read_answer(&frame));
        }
        answers.sort_unstable();
        assert_eq!(answers, [(JOIN, 1, NONE), (JOIN, 2, NONE)]);
        // Member 0's session started too, although nobody read its answer.
        client
            .write_all(&protocol::request(HEARTBEAT, 0))
            .await
            .unwrap();
        let mut frame = [0u8; protocol::ANSWER_LEN];
        client.read_exact(&mut frame).await.unwrap();
        assert_eq!(protocol::read_answer(&frame), (HEARTBEAT, 0, NONE));
        let _ = stop.send(());
        serving.await.unwrap();
        coordinator.shutdown().await;
    });
}
