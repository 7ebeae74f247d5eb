//! Which APIs and versions the broker implements, and the ApiVersions answer built from
//! them. Only what is implemented is advertised: clients choose features from this list.
//!
//! Choices (each the highest version the handlers fill correctly, within what the clients
//! need):
//! - Fetch 4..=12: rskafka speaks only v4; v13+ would name topics by id, which this broker
//!   does not assign (confluent-kafka misbehaves when v13+ is advertised without them).
//! - Produce 3..=9, Metadata 0..=9, ListOffsets 1..=6, InitProducerId 0..=4,
//!   ApiVersions 0..=3: message format v2 and idempotent producers, no topic ids.

use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::{ApiKey, ApiVersionsResponse};
use kafka_protocol::ResponseError;

/// One implemented API and its version range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SupportedApi {
    /// The API.
    pub key: ApiKey,
    /// Lowest version handled.
    pub min: i16,
    /// Highest version handled.
    pub max: i16,
}

/// Everything the broker answers; any other API closes the connection.
pub const SUPPORTED: &[SupportedApi] = &[
    SupportedApi {
        key: ApiKey::Produce,
        min: 3,
        max: 9,
    },
    SupportedApi {
        key: ApiKey::Fetch,
        min: 4,
        max: 12,
    },
    SupportedApi {
        key: ApiKey::ListOffsets,
        min: 1,
        max: 6,
    },
    SupportedApi {
        key: ApiKey::Metadata,
        min: 0,
        max: 9,
    },
    SupportedApi {
        key: ApiKey::ApiVersions,
        min: 0,
        max: 3,
    },
    SupportedApi {
        key: ApiKey::InitProducerId,
        min: 0,
        max: 4,
    },
];

/// Whether `version` of `key` is implemented.
pub fn is_supported(key: ApiKey, version: i16) -> bool {
    SUPPORTED
        .iter()
        .any(|api| api.key == key && (api.min..=api.max).contains(&version))
}

/// The ApiVersions answer; `unsupported` when the request's own version is too new (the
/// client then retries with v0, as KIP-511 says).
pub fn response(unsupported: bool) -> ApiVersionsResponse {
    let mut response = ApiVersionsResponse::default();
    if unsupported {
        response.error_code = ResponseError::UnsupportedVersion.code();
    }
    response.api_keys = SUPPORTED
        .iter()
        .map(|api| {
            let mut version = ApiVersion::default();
            version.api_key = api.key as i16;
            version.min_version = api.min;
            version.max_version = api.max;
            version
        })
        .collect();
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::ApiVersionsResponse;
    use kafka_protocol::protocol::{Decodable, Encodable};

    #[test]
    fn advertised_ranges_are_within_what_the_codec_knows() {
        for api in SUPPORTED {
            let codec = api.key.valid_versions();
            assert!(
                codec.min <= api.min && api.max <= codec.max,
                "{:?}",
                api.key
            );
            assert!(api.min <= api.max);
        }
    }

    #[test]
    fn fetch_stops_before_topic_ids_and_includes_rskafkas_v4() {
        assert!(is_supported(ApiKey::Fetch, 4));
        assert!(is_supported(ApiKey::Fetch, 12));
        assert!(!is_supported(ApiKey::Fetch, 13));
        assert!(!is_supported(ApiKey::OffsetCommit, 2));
    }

    #[test]
    fn the_answer_round_trips_in_every_version() {
        for version in 0..=3 {
            let mut buf = bytes::BytesMut::new();
            response(false).encode(&mut buf, version).unwrap();
            let decoded = ApiVersionsResponse::decode(&mut buf.freeze(), version).unwrap();
            assert_eq!(decoded.api_keys.len(), SUPPORTED.len());
            assert_eq!(decoded.error_code, 0);
        }
    }
}
