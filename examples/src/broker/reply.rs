//! What a request handler hands back to its connection, and how a response is framed.
//!
//! A response is its size, the response header (whose version follows from the API and
//! version of the request) and the body encoded in the request's version.

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, ResponseHeader};
use kafka_protocol::protocol::Encodable;

/// The outcome of one request for its connection.
#[derive(Debug)]
pub enum Reply {
    /// Write this frame.
    Send(Bytes),
    /// Nothing to write (acks=0 produce).
    Nothing,
    /// Close the connection (malformed or unsupported request), with the reason to log.
    Close(String),
}

/// Frames `body` as the answer to request `correlation_id` of `api` at `version`.
pub fn respond<R: Encodable>(api: ApiKey, version: i16, correlation_id: i32, body: &R) -> Reply {
    let mut header = ResponseHeader::default();
    header.correlation_id = correlation_id;
    let mut frame = BytesMut::with_capacity(256);
    frame.put_i32(0);
    let encoded = header
        .encode(&mut frame, api.response_header_version(version))
        .and_then(|()| body.encode(&mut frame, version));
    if let Err(e) = encoded {
        // A handler filled a field this version cannot carry: a bug, but not the client's
        // fault; the connection is closed rather than sending something malformed.
        return Reply::Close(format!("cannot encode {api:?} v{version} response: {e}"));
    }
    let Ok(size) = i32::try_from(frame.len() - 4) else {
        return Reply::Close(format!("{api:?} response too large"));
    };
    frame[..4].copy_from_slice(&size.to_be_bytes());
    Reply::Send(frame.freeze())
}
