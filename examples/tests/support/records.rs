//! Record batches the broker suites build by hand, where the library's `encode_batch`
//! (no producer id) will not do.

use bytes::{Bytes, BytesMut};
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};

/// One idempotent batch of `value` as producer `producer_id`, epoch 0, at `sequence`.
pub fn idempotent_batch(producer_id: i64, sequence: i32, value: &'static [u8]) -> Bytes {
    let record = Record {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: 0,
        producer_id,
        producer_epoch: 0,
        timestamp_type: TimestampType::Creation,
        offset: 0,
        sequence,
        timestamp: 1_000,
        key: None,
        value: Some(Bytes::from_static(value)),
        headers: Default::default(),
    };
    let mut buf = BytesMut::new();
    let options = RecordEncodeOptions {
        version: 2,
        compression: Compression::None,
    };
    RecordBatchEncoder::encode(&mut buf, [&record], &options).unwrap();
    buf.freeze()
}
