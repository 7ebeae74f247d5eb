//! The broker's configuration and its command-line flags.

use std::net::SocketAddr;
use std::time::Duration;

use crate::cli::{FlagError, Flags};
use crate::followers::FollowerConfig;

/// Flags the `broker` binary understands, for `--help`.
pub const USAGE: &str = "usage: broker [--listen ADDR] [--topic NAME] [--partitions N] \
[--followers N] [--replication-delay-ms D] [--stall-followers] [--max-frame-bytes B] \
[--max-produce-wait-ms T] [--metrics-listen ADDR]
  --listen ADDR             address to listen on (default 127.0.0.1:9092; port 0 = any free port)
  --topic NAME              the one topic served (default demo)
  --partitions N            its partitions (default 1)
  --followers N             simulated in-process followers of every partition (default 2)
  --replication-delay-ms D  how far the followers lag behind the leader (default 50)
  --stall-followers         followers never catch up: acks=all produces time out
  --max-frame-bytes B       largest request accepted (default 104857600, Kafka's)
  --max-produce-wait-ms T   cap on an acks=all produce's own timeout (default: none)
  --metrics-listen ADDR     serve the purgatories' figures as Prometheus text over HTTP there
                            (default: not served; port 0 = any free port)";

/// How a broker is set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerConfig {
    /// Where to listen (only loopback addresses are meant here).
    pub listen: SocketAddr,
    /// The topic served.
    pub topic: String,
    /// Its partition count.
    pub partitions: usize,
    /// Simulated followers.
    pub followers: FollowerConfig,
    /// Largest request frame accepted; a larger one closes the connection.
    pub max_frame_bytes: usize,
    /// Cap on how long an acks=all produce waits, whatever its own timeout says.
    pub max_produce_wait: Option<Duration>,
    /// Where the binary serves Prometheus text (see `metrics_endpoint.rs`), if anywhere.
    pub metrics_listen: Option<SocketAddr>,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 9092)),
            topic: "demo".to_string(),
            partitions: 1,
            followers: FollowerConfig {
                count: 2,
                lag: Duration::from_millis(50),
                stalled: false,
            },
            max_frame_bytes: 100 * 1024 * 1024,
            max_produce_wait: None,
            metrics_listen: None,
        }
    }
}

/// The largest partition count accepted (partition indexes are `i32` on the wire).
pub const MAX_PARTITIONS: usize = 100_000;

impl BrokerConfig {
    /// Reads the flags of [`USAGE`].
    pub fn from_args<I>(args: I) -> Result<BrokerConfig, FlagError>
    where
        I: IntoIterator<Item = String>,
    {
        let flags = Flags::parse(
            args,
            &[
                "--listen",
                "--topic",
                "--partitions",
                "--followers",
                "--replication-delay-ms",
                "--max-frame-bytes",
                "--max-produce-wait-ms",
                "--metrics-listen",
            ],
            &["--stall-followers"],
        )?;
        let defaults = BrokerConfig::default();
        let partitions: usize = flags.get("--partitions", defaults.partitions)?;
        if partitions == 0 || partitions > MAX_PARTITIONS {
            return Err(FlagError::BadValue {
                flag: "--partitions".into(),
                value: partitions.to_string(),
                why: format!("must be 1..={MAX_PARTITIONS}"),
            });
        }
        let topic: String = flags.get("--topic", defaults.topic)?;
        if topic.is_empty() || topic.len() > 249 {
            return Err(FlagError::BadValue {
                flag: "--topic".into(),
                value: topic,
                why: "a topic name has 1 to 249 characters".into(),
            });
        }
        let max_produce_wait: Option<u64> = match flags.get("--max-produce-wait-ms", 0u64)? {
            0 => None,
            ms => Some(ms),
        };
        Ok(BrokerConfig {
            listen: flags.get("--listen", defaults.listen)?,
            topic,
            partitions,
            followers: FollowerConfig {
                count: flags.get("--followers", defaults.followers.count)?,
                lag: Duration::from_millis(flags.get("--replication-delay-ms", 50u64)?),
                stalled: flags.switch("--stall-followers"),
            },
            max_frame_bytes: flags.get("--max-frame-bytes", defaults.max_frame_bytes)?,
            max_produce_wait: max_produce_wait.map(Duration::from_millis),
            metrics_listen: flags.get_opt("--metrics-listen")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<BrokerConfig, FlagError> {
        BrokerConfig::from_args(args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn defaults_match_the_documented_ones() {
        let config = parse(&[]).unwrap();
        assert_eq!(config, BrokerConfig::default());
        assert_eq!(config.listen.to_string(), "127.0.0.1:9092");
        assert_eq!(config.topic, "demo");
        assert_eq!(config.followers.count, 2);
        assert_eq!(config.followers.lag, Duration::from_millis(50));
    }

    #[test]
    fn every_flag_is_read() {
        let config = parse(&[
            "--listen",
            "127.0.0.1:0",
            "--topic",
            "t",
            "--partitions",
            "3",
            "--followers",
            "1",
            "--replication-delay-ms",
            "7",
            "--stall-followers",
            "--max-frame-bytes",
            "1000",
            "--max-produce-wait-ms",
            "250",
        ])
        .unwrap();
        assert_eq!(config.listen.port(), 0);
        assert_eq!((config.topic.as_str(), config.partitions), ("t", 3));
        assert_eq!(config.followers.count, 1);
        assert_eq!(config.followers.lag, Duration::from_millis(7));
        assert!(config.followers.stalled);
        assert_eq!(config.max_frame_bytes, 1000);
        assert_eq!(config.max_produce_wait, Some(Duration::from_millis(250)));
    }

    #[test]
    fn bad_values_are_refused() {
        assert!(parse(&["--partitions", "0"]).is_err());
        assert!(parse(&["--listen", "nowhere"]).is_err());
        assert!(parse(&["--topic", ""]).is_err());
        assert!(parse(&["--followers", "-1"]).is_err());
    }
}
