//! What a request handler hands back to its connection, and how a response is framed.
//!
//! A response is its size, the response header (whose version follows from the API and
//! version of the request) and the body encoded in the request's version.
//!
//! Invariants:
//! - An answer shares the bytes it carries rather than copying them: the encoder writes
//!   into [`SharingBuf`], which keeps any slice of at least [`SHARE_AT_LEAST`] bytes lying
//!   inside one of the buffers the handler names as shared (a fetch's records, which are
//!   slices of the log's segments; a Metadata request's body, whose topic names it echoes)
//!   as a reference to that buffer, and copies only the rest (headers, offsets, small
//!   fields). A thousand unread answers of the same 8 MiB batch hold the batch once.
//! - An [`Answer`] is a list of parts written back to back; its first part is the frame
//!   size, computed once the body is encoded. It knows how many of its bytes it copied
//!   ([`Answer::copied`]), which its connection holds in the request budget until it is
//!   written; the shared parts are already counted (the request's) or the log's.

use std::ops::Range;

use bytes::buf::UninitSlice;
use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, ResponseHeader};
use kafka_protocol::protocol::buf::ByteBufMut;
use kafka_protocol::protocol::Encodable;

/// Slices at least this long are shared rather than copied (below it a copy is cheaper
/// than another part to write).
pub const SHARE_AT_LEAST: usize = 4 * 1024;

/// The outcome of one request for its connection.
#[derive(Debug)]
pub enum Reply {
    /// Write this answer.
    Send(Answer),
    /// Nothing to write (acks=0 produce).
    Nothing,
    /// Close the connection (malformed or unsupported request), with the reason to log.
    Close(String),
}

/// A framed answer: parts written back to back, the large ones shared with the log or the
/// request.
#[derive(Debug)]
pub struct Answer {
    parts: Vec<Bytes>,
    /// Bytes of `parts` that are shared rather than copied.
    shared: usize,
}

impl Answer {
    /// The parts, in order.
    pub fn parts(&self) -> &[Bytes] {
        &self.parts
    }

    /// Bytes in all parts.
    pub fn len(&self) -> usize {
        self.parts.iter().map(Bytes::len).sum()
    }

    /// Bytes copied into the answer (all but the shared parts), or made for it.
    pub fn copied(&self) -> usize {
        self.len() - self.shared
    }

    /// Counts `bytes` of the shared parts as copied: they were made for this answer (a
    /// read that joined several batches), so nothing but the answer holds them.
    pub fn count_as_copied(&mut self, bytes: usize) {
        self.shared = self.shared.saturating_sub(bytes);
    }
}

/// Frames `body` as the answer to request `correlation_id` of `api` at `version`.
pub fn respond<R: Encodable>(api: ApiKey, version: i16, correlation_id: i32, body: &R) -> Reply {
    respond_sharing(api, version, correlation_id, body, &[])
}

/// Like [`respond`], sharing rather than copying the parts of `body` that lie inside
/// `shared` (see the module's invariants).
pub fn respond_sharing<R: Encodable>(
    api: ApiKey,
    version: i16,
    correlation_id: i32,
    body: &R,
    shared: &[Bytes],
) -> Reply {
    let mut header = ResponseHeader::default();
    header.correlation_id = correlation_id;
    let mut buf = SharingBuf::new(shared);
    let encoded = header
        .encode(&mut buf, api.response_header_version(version))
        .and_then(|()| body.encode(&mut buf, version));
    if let Err(e) = encoded {
        // A handler filled a field this version cannot carry: a bug, but not the client's
        // fault; the connection is closed rather than sending something malformed.
        return Reply::Close(format!("cannot encode {api:?} v{version} response: {e}"));
    }
    let Ok(size) = i32::try_from(buf.offset()) else {
        return Reply::Close(format!("{api:?} response too large"));
    };
    let shared = buf.shared_len;
    let mut parts = vec![Bytes::copy_from_slice(&size.to_be_bytes())];
    parts.extend(buf.finish());
    Reply::Send(Answer { parts, shared })
}

/// An encoding buffer that keeps large slices of `shared` buffers as references.
///
/// `offset`, `seek` and `range` (which `kafka-protocol` uses to fill gaps it left, in record
/// batches, never in the messages answered here) work within the part being copied into.
struct SharingBuf<'a> {
    /// Parts finished so far.
    done: Vec<Bytes>,
    /// Bytes in `done`.
    done_len: usize,
    /// Bytes in `done` shared rather than copied.
    shared_len: usize,
    /// The part being copied into.
    tail: BytesMut,
    shared: &'a [Bytes],
}

impl<'a> SharingBuf<'a> {
    fn new(shared: &'a [Bytes]) -> Self {
        SharingBuf {
            done: Vec::new(),
            done_len: 0,
            shared_len: 0,
            tail: BytesMut::with_capacity(256),
            shared,
        }
    }

    /// The buffer of `shared` that `slice` lies in, if any.
    fn owner_of(&self, slice: &[u8]) -> Option<&'a Bytes> {
        let start = slice.as_ptr() as usize;
        let end = start + slice.len();
        self.shared.iter().find(|owner| {
            let from = owner.as_ptr() as usize;
            from <= start && end <= from + owner.len()
        })
    }

    fn finish(mut self) -> Vec<Bytes> {
        if !self.tail.is_empty() {
            self.done.push(self.tail.freeze());
        }
        self.done
    }
}

// SAFETY: every method delegates to the `BytesMut` being copied into, which upholds
// `BufMut`'s contract (`chunk_mut` is its spare capacity, `advance_mut` marks bytes of it
// initialised); `put_slice` either copies through that `BytesMut` or writes nothing to it.
unsafe impl BufMut for SharingBuf<'_> {
    fn remaining_mut(&self) -> usize {
        self.tail.remaining_mut()
    }

    unsafe fn advance_mut(&mut self, cnt: usize) {
        // SAFETY: the caller initialised `cnt` bytes of the chunk `chunk_mut` returned,
        // which is the tail's (the precondition of `BytesMut::advance_mut`).
        unsafe { self.tail.advance_mut(cnt) }
    }

    fn chunk_mut(&mut self) -> &mut UninitSlice {
        self.tail.chunk_mut()
    }

    fn put_slice(&mut self, src: &[u8]) {
        if src.len() >= SHARE_AT_LEAST {
            if let Some(owner) = self.owner_of(src) {
                let part = owner.slice_ref(src);
                if !self.tail.is_empty() {
                    let copied = self.tail.split().freeze();
                    self.done_len += copied.len();
                    self.done.push(copied);
                }
                self.done_len += part.len();
                self.shared_len += part.len();
                self.done.push(part);
                return;
            }
        }
        self.tail.extend_from_slice(src);
    }
}

impl ByteBufMut for SharingBuf<'_> {
    fn offset(&self) -> usize {
        self.done_len + self.tail.len()
    }

    fn seek(&mut self, offset: usize) {
        let within = offset
            .checked_sub(self.done_len)
            .expect("kafka-protocol seeks only within the part being copied into");
        self.tail.resize(within, 0);
    }

    fn range(&mut self, r: Range<usize>) -> &mut [u8] {
        let base = self.done_len;
        &mut self.tail[r.start - base..r.end - base]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
    use kafka_protocol::messages::{FetchResponse, ResponseHeader};
    use kafka_protocol::protocol::Decodable;

    fn fetch_answer(records: &[Bytes]) -> FetchResponse {
        let mut topic = FetchableTopicResponse::default();
        topic.partitions = records
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let mut data = PartitionData::default();
                data.partition_index = i as i32;
                data.records = Some(r.clone());
                data
            })
            .collect();
        let mut response = FetchResponse::default();
        response.responses = vec![topic];
        response
    }

    fn joined(answer: &Answer) -> Bytes {
        let mut out = BytesMut::new();
        for part in answer.parts() {
            out.extend_from_slice(part);
        }
        out.freeze()
    }

    #[test]
    fn large_records_are_shared_and_the_frame_is_what_a_copy_would_be() {
        let log = Bytes::from(vec![7u8; 1 << 20]);
        let records = [
            log.slice(100..300_100),
            Bytes::from_static(b"small"),
            log.clone(),
        ];
        for version in [4, 11, 12] {
            let response = fetch_answer(&records);
            let Reply::Send(shared) =
                respond_sharing(ApiKey::Fetch, version, 9, &response, &records)
            else {
                panic!("not sent");
            };
            let Reply::Send(copied) = respond(ApiKey::Fetch, version, 9, &response) else {
                panic!("not sent");
            };
            assert_eq!(joined(&shared), joined(&copied), "v{version}");
            // The two large records are parts of their own, pointing into the log.
            let pointing: Vec<usize> = shared
                .parts()
                .iter()
                .filter(|p| p.len() >= SHARE_AT_LEAST)
                .map(|p| p.as_ptr() as usize - log.as_ptr() as usize)
                .collect();
            assert_eq!(pointing, vec![100, 0], "v{version}");
            assert_eq!(copied.parts().len(), 2);
            assert_eq!(copied.copied(), copied.len());
            assert_eq!(shared.copied(), shared.len() - 300_000 - (1 << 20));
            // The frame decodes: size, header, the body with every record.
            let mut frame = joined(&shared);
            let size = i32::from_be_bytes(frame[..4].try_into().unwrap());
            assert_eq!(size as usize, frame.len() - 4);
            let _ = bytes::Buf::copy_to_bytes(&mut frame, 4);
            let header =
                ResponseHeader::decode(&mut frame, ApiKey::Fetch.response_header_version(version))
                    .unwrap();
            assert_eq!(header.correlation_id, 9);
            let decoded = FetchResponse::decode(&mut frame, version).unwrap();
            assert_eq!(
                decoded.responses[0].partitions[2].records.as_ref(),
                Some(&log)
            );
        }
    }
}
