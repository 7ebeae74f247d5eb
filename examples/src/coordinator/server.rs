//! The coordinator's server: a tokio TCP server answering [`protocol`]
//! frames from a [`Coordinator`]. Per connection, a reader answers heartbeats inline and
//! spawns a task per join (which waits at its group's barrier); a writer sends the
//! answers, as many as are queued in one write.
//!
//! A frame of an unknown kind closes the connection; a member id out of range is
//! answered `UNKNOWN_MEMBER_ID`. Joins in flight when a connection closes still run to
//! their end (a member that joined is in its group whether or not it reads the answer).
//! At most [`QUEUED`] answers wait for a connection's writer: a client that does not read
//! them is no longer read either (its requests wait in its socket), so what a connection
//! holds is bounded. A join's task holds one member's place in it, and each member joins
//! once. Loopback only; this is the example's measuring server, not a hardened one (the
//! broker, `src/broker/`, is that).

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use super::protocol::{self, HEARTBEAT, JOIN, REQUEST_LEN, STATS};
use super::Coordinator;

/// Most answers queued for one connection's writer.
pub const QUEUED: usize = 8_192;

/// An answer queued for a connection's writer.
enum Outgoing {
    Answer([u8; protocol::ANSWER_LEN]),
    Stats([u8; protocol::STATS_LEN]),
}

/// Accepts connections until `stop` resolves, then stops accepting and returns.
pub async fn serve(
    listener: TcpListener,
    coordinator: Arc<dyn Coordinator>,
    stop: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => return,
            accepted = listener.accept() => {
                if let Ok((stream, _)) = accepted {
                    let _ = stream.set_nodelay(true);
                    tokio::spawn(connection(stream, Arc::clone(&coordinator)));
                }
            }
        }
    }
}

async fn connection(stream: TcpStream, coordinator: Arc<dyn Coordinator>) {
    let (reader, mut writer) = stream.into_split();
    let (outgoing, mut queued) = mpsc::channel::<Outgoing>(QUEUED);
    tokio::spawn(async move {
        let mut batch = Vec::with_capacity(512);
        let mut bytes = Vec::with_capacity(512 * protocol::ANSWER_LEN);
        while queued.recv_many(&mut batch, 512).await > 0 {
            bytes.clear();
            for out in batch.drain(..) {
                match out {
                    Outgoing::Answer(frame) => bytes.extend_from_slice(&frame),
                    Outgoing::Stats(frame) => bytes.extend_from_slice(&frame),
                }
            }
            if writer.write_all(&bytes).await.is_err() {
                return;
            }
        }
    });
    let mut reader = BufReader::with_capacity(64 * 1024, reader);
    let mut frame = [0u8; REQUEST_LEN];
    while reader.read_exact(&mut frame).await.is_ok() {
        let (kind, member) = protocol::read_request(&frame);
        let out = match kind {
            HEARTBEAT => Outgoing::Answer(protocol::answer(
                HEARTBEAT,
                member,
                coordinator.heartbeat(member),
            )),
            JOIN => {
                let joined = coordinator.join(member);
                let outgoing = outgoing.clone();
                tokio::spawn(async move {
                    let error = joined.await;
                    let _ = outgoing
                        .send(Outgoing::Answer(protocol::answer(JOIN, member, error)))
                        .await;
                });
                continue;
            }
            STATS => Outgoing::Stats(protocol::stats_answer(coordinator.stats())),
            _ => return,
        };
        if outgoing.send(out).await.is_err() {
            return;
        }
    }
}
