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
//!   fields). A thousand unread answers of the same 8 MiB batch hold the batch once (each
//!   still counts what it keeps alive, below: any of them may be the last to hold it).
//! - An [`Answer`] is a list of parts written back to back; its first part is the frame
//!   size, computed once the body is encoded.
//! - An answer knows what memory it keeps alive until it is written ([`Answer::held`]),
//!   which its connection holds in the request budget that long (`request_budget.rs`):
//!   the bytes it copied, and the parts it shares with the log ([`Holder::Log`]) at what
//!   the read that made them keeps alive, as the read itself said
//!   (`PartitionLog::read_keeping`): its segment's length for a slice of a sealed segment
//!   (4/3 of the slice at most, and a segment more at most: a slice shares its segment only
//!   when it is three quarters of it or more, `partition_log.rs`, `kept_alive_by`), its
//!   own length for a copy or a batch's own buffer. Retention may drop that segment while
//!   the answer waits; it then belongs to the answer alone, and is counted (issue #38,
//!   finding 5: unread answers kept 2.5 GB of dropped segments under a 16 MiB retention,
//!   counted nowhere). The parts shared with the request ([`Holder::Request`]) cost
//!   nothing more: the request's frame stays counted until its last slice is dropped.
//!   So memory kept alive by unwritten answers <= what their connections hold for them.

use std::ops::Range;

use bytes::buf::UninitSlice;
use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, ResponseHeader};
use kafka_protocol::protocol::buf::ByteBufMut;
use kafka_protocol::protocol::Encodable;

use super::request_budget::Charge;


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

/// Who holds a buffer an answer shares, and so what sharing it costs the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    /// The request's frame, counted until its last slice is dropped: sharing it costs
    /// nothing more.
    Request,
    /// The log: a slice of a segment or a batch's own buffer, counted at what it keeps
    /// alive, `keeps` (its segment's length, or its own: what the read said,
    /// `PartitionLog::read_keeping`), since retention may drop its segment while the
    /// answer waits.
    Log {
        /// What the buffer keeps alive (at least its length).
        keeps: usize,
    },
}

/// A framed answer: parts written back to back, the large ones shared with the log or the
/// request.
#[derive(Debug)]
pub struct Answer {
    parts: Vec<Bytes>,
    /// Bytes of `parts` that are shared rather than copied.
    shared: usize,
    /// What the shared parts keep alive that nothing else counts (see [`Holder`]).
    shared_held: usize,
    /// What [`held`](Self::held) is held under, if its handler took it already.
    charge: Option<Charge>,
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

    /// Bytes copied into the answer (all but the shared parts).
    pub fn copied(&self) -> usize {
        self.len() - self.shared
    }

    /// The memory the answer keeps alive until it is written, beyond what the request
    /// budget already counts: its copies, and what its shared parts keep (see [`Holder`]).
    /// Its connection holds this in the request budget until the answer is written.
    pub fn held(&self) -> usize {
        self.copied() + self.shared_held
    }

    /// The answer, with `charge` holding what it keeps alive (taken by its handler, which
    /// answers otherwise when the budget refuses it).
    pub fn holding(mut self, charge: Charge) -> Self {
        self.charge = Some(charge);
        self
    }

    /// The charge its handler took for it, if any.
    pub fn take_charge(&mut self) -> Option<Charge> {
        self.charge.take()
    }
}

/// Frames `body` as the answer to request `correlation_id` of `api` at `version`.
pub fn respond<R: Encodable>(api: ApiKey, version: i16, correlation_id: i32, body: &R) -> Reply {
    respond_sharing(api, version, correlation_id, body, &[])
}

/// Like [`respond`], sharing rather than copying the parts of `body` that lie inside the
/// buffers of `shared`, each named with its holder (see the module's invariants).
pub fn respond_sharing<R: Encodable>(
    api: ApiKey,
    version: i16,
    correlation_id: i32,
    body: &R,
    shared: &[(Bytes, Holder)],
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
    let (shared, shared_held) = (buf.shared_len, buf.shared_held);
    let mut parts = vec![Bytes::copy_from_slice(&size.to_be_bytes())];
    parts.extend(buf.finish());
    Reply::Send(Answer {
        parts,
        shared,
        shared_held,
        charge: None,
    })
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
    /// What the shared parts keep alive, by their holders (see [`Holder`]).
    shared_held: usize,
    /// The part being copied into.
    tail: BytesMut,
    shared: &'a [(Bytes, Holder)],
}

impl<'a> SharingBuf<'a> {
    fn new(shared: &'a [(Bytes, Holder)]) -> Self {
        SharingBuf {
            done: Vec::new(),
            done_len: 0,
            shared_len: 0,
            shared_held: 0,
            tail: BytesMut::with_capacity(256),
            shared,
        }
    }

    /// The buffer of `shared` that `slice` lies in, if any, and its holder.
    fn owner_of(&self, slice: &[u8]) -> Option<&'a (Bytes, Holder)> {
        let start = slice.as_ptr() as usize;
        let end = start + slice.len();
        self.shared.iter().find(|(owner, _)| {
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
            if let Some((owner, holder)) = self.owner_of(src) {
                let part = owner.slice_ref(src);
                self.shared_held += match holder {
                    Holder::Request => 0,
                    // Its whole segment, once per part (a buffer written in several
                    // parts, which fetch answers never are, would count it again: more,
                    // never less).
                    Holder::Log { keeps } => (*keeps).max(part.len()),
                };
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
    fn an_answer_holds_what_its_shared_parts_keep_alive_by_their_holders() {
        let records = [
            Bytes::from(vec![1u8; 90_000]),
            Bytes::from(vec![2u8; 50_000]),
            Bytes::from(vec![3u8; 30_000]),
            Bytes::from(vec![4u8; 100]),
        ];
        let holders = [
            Holder::Log { keeps: 120_000 },
            Holder::Log { keeps: 50_000 },
            Holder::Request,
            Holder::Log { keeps: 100 },
        ];
        let shared: Vec<(Bytes, Holder)> = records.iter().cloned().zip(holders).collect();
        let Reply::Send(answer) =
            respond_sharing(ApiKey::Fetch, 12, 1, &fetch_answer(&records), &shared)
        else {
            panic!("not sent");
        };
        // The 100 bytes are copied (below `SHARE_AT_LEAST`); the request's part costs
        // nothing more, the answer's its length, the log's what the read said it keeps.
        assert_eq!(answer.copied(), answer.len() - 170_000);
        assert_eq!(answer.held(), answer.copied() + 50_000 + 120_000);
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
            let owners: Vec<(Bytes, Holder)> =
                records.iter().map(|r| (r.clone(), Holder::Log { keeps: r.len() })).collect();
            let Reply::Send(shared) =
                respond_sharing(ApiKey::Fetch, version, 9, &response, &owners)
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
            // The shared records count at what they keep alive, as their reads said.
            assert_eq!(shared.held(), shared.copied() + 300_000 + (1 << 20));
            assert_eq!(copied.held(), copied.len());
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
