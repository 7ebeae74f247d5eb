//! A minimal Kafka-protocol client over one TCP connection: encode a request with
//! `kafka-protocol`, frame it, read the framed answer. For the tests and the load tool,
//! which need raw control (pipelining, exact versions, malformed frames).
//!
//! Invariants: correlation ids count up from 1 per connection; `receive` checks the answer's
//! id against the oldest request sent and not yet answered (Kafka answers in order).

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{encode_request_header_into_buffer, Decodable, Request, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

use crate::broker::frame::read_frame;

/// Largest answer accepted.
const MAX_RESPONSE: usize = 256 * 1024 * 1024;

/// One connection to a broker.
pub struct WireClient {
    reader: OwnedReadHalf,
    writer: OwnedWriteHalf,
    next_id: i32,
    /// `(correlation id, api key, version)` of requests awaiting an answer, oldest first.
    in_flight: VecDeque<(i32, i16, i16)>,
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

impl WireClient {
    /// Connects to `addr`.
    pub async fn connect(addr: SocketAddr) -> io::Result<WireClient> {
        Self::over(TcpStream::connect(addr).await?)
    }

    /// Connects to `addr` from the local address `source` (port chosen by the system): on
    /// Linux every 127.x.y.z is a loopback address, so tests can be distinct clients.
    pub async fn connect_from(
        source: std::net::IpAddr,
        addr: SocketAddr,
    ) -> io::Result<WireClient> {
        let socket = match source {
            std::net::IpAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
            std::net::IpAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
        };
        socket.bind(SocketAddr::new(source, 0))?;
        Self::over(socket.connect(addr).await?)
    }

    /// A client over a connected `stream` (Nagle off: requests are small and waited for).
    fn over(stream: TcpStream) -> io::Result<WireClient> {
        stream.set_nodelay(true)?;
        let (reader, writer) = stream.into_split();
        Ok(WireClient {
            reader,
            writer,
            next_id: 1,
            in_flight: VecDeque::new(),
        })
    }

    /// Sends `request` at `version` without waiting; returns its correlation id.
    pub async fn send<R: Request>(&mut self, version: i16, request: &R) -> io::Result<i32> {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        let mut header = RequestHeader::default();
        header.request_api_key = R::KEY;
        header.request_api_version = version;
        header.correlation_id = id;
        header.client_id = Some(StrBytes::from_static_str("purgatory-examples"));
        let mut frame = BytesMut::with_capacity(128);
        frame.put_i32(0);
        encode_request_header_into_buffer(&mut frame, &header)
            .and_then(|()| request.encode(&mut frame, version))
            .map_err(|e| invalid(format!("cannot encode request: {e}")))?;
        let size = (frame.len() - 4) as i32;
        frame[..4].copy_from_slice(&size.to_be_bytes());
        self.writer.write_all(&frame).await?;
        self.in_flight.push_back((id, R::KEY, version));
        Ok(id)
    }

    /// Reads the answer to the oldest request in flight, which must be an `R`.
    pub async fn receive<R: Request>(&mut self) -> io::Result<R::Response> {
        let (id, key, version) = self
            .in_flight
            .pop_front()
            .ok_or_else(|| invalid("no request in flight".into()))?;
        if key != R::KEY {
            return Err(invalid(format!("oldest request in flight has key {key}")));
        }
        let mut frame = self
            .read_raw()
            .await?
            .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed"))?;
        let api = kafka_protocol::messages::ApiKey::try_from(key)
            .map_err(|_| invalid(format!("unknown key {key}")))?;
        let header = ResponseHeader::decode(&mut frame, api.response_header_version(version))
            .map_err(|e| invalid(format!("bad response header: {e}")))?;
        if header.correlation_id != id {
            return Err(invalid(format!(
                "answer for request {} while {id} was expected",
                header.correlation_id
            )));
        }
        R::Response::decode(&mut frame, version).map_err(|e| invalid(format!("bad response: {e}")))
    }

    /// Sends `request` and waits for its answer.
    pub async fn call<R: Request>(&mut self, version: i16, request: &R) -> io::Result<R::Response> {
        self.send(version, request).await?;
        self.receive::<R>().await
    }

    /// Writes raw bytes (for malformed input).
    pub async fn send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.writer.write_all(bytes).await
    }

    /// Makes closing this connection (dropping the client) reset it instead of a clean
    /// close: lingering off, so the kernel sends a reset and drops unsent data.
    pub fn reset_on_drop(&self) -> io::Result<()> {
        self.reader.as_ref().set_zero_linger()
    }

    /// Reads whatever bytes arrive next, at most `buf.len()`, with no framing (for clients
    /// that read slowly); 0 when the broker closed the connection.
    pub async fn read_some(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.reader.read(buf).await
    }

    /// Reads one raw frame; `None` when the broker closed the connection.
    pub async fn read_raw(&mut self) -> io::Result<Option<Bytes>> {
        read_frame(&mut self.reader, MAX_RESPONSE)
            .await
            .map_err(|e| invalid(e.to_string()))
    }
}

/// Helpers to build the requests the tests and the load tool send.
pub mod requests {
    use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
    use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    use kafka_protocol::messages::{
        BrokerId, FetchRequest, ListOffsetsRequest, ProduceRequest, TopicName,
    };
    use kafka_protocol::protocol::StrBytes;

    use bytes::Bytes;

    fn topic_name(topic: &str) -> TopicName {
        TopicName(StrBytes::from_string(topic.to_string()))
    }

    /// A produce of `records` (an encoded batch) to one partition.
    pub fn produce(
        topic: &str,
        partition: i32,
        acks: i16,
        timeout_ms: i32,
        records: Bytes,
    ) -> ProduceRequest {
        let mut data = PartitionProduceData::default();
        data.index = partition;
        data.records = Some(records);
        let mut topic_data = TopicProduceData::default();
        topic_data.name = topic_name(topic);
        topic_data.partition_data = vec![data];
        let mut request = ProduceRequest::default();
        request.acks = acks;
        request.timeout_ms = timeout_ms;
        request.topic_data = vec![topic_data];
        request
    }

    /// A consumer fetch of one partition.
    pub fn fetch(
        topic: &str,
        partition: i32,
        offset: i64,
        min_bytes: i32,
        max_wait_ms: i32,
    ) -> FetchRequest {
        let mut wanted = FetchPartition::default();
        wanted.partition = partition;
        wanted.fetch_offset = offset;
        wanted.partition_max_bytes = 1 << 20;
        let mut fetch_topic = FetchTopic::default();
        fetch_topic.topic = topic_name(topic);
        fetch_topic.partitions = vec![wanted];
        let mut request = FetchRequest::default();
        request.replica_id = BrokerId(-1);
        request.min_bytes = min_bytes;
        request.max_wait_ms = max_wait_ms;
        request.max_bytes = 50 << 20;
        request.topics = vec![fetch_topic];
        request
    }

    /// A ListOffsets for the latest committed offset (`timestamp` -1) or another.
    pub fn list_offsets(topic: &str, partition: i32, timestamp: i64) -> ListOffsetsRequest {
        let mut wanted = ListOffsetsPartition::default();
        wanted.partition_index = partition;
        wanted.timestamp = timestamp;
        let mut list_topic = ListOffsetsTopic::default();
        list_topic.name = topic_name(topic);
        list_topic.partitions = vec![wanted];
        let mut request = ListOffsetsRequest::default();
        request.replica_id = BrokerId(-1);
        request.topics = vec![list_topic];
        request
    }
}
