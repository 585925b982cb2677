//! `[failover]`: how the agent rides out one of a namespace's endpoints
//! dying or hanging (`s3::endpoints` keeps each endpoint's health,
//! `s3::guarded` enforces the deadlines and resumes reads elsewhere).
//!
//! An endpoint is ejected at once when nothing listens on it (a refused
//! connection) or nothing answers (a missed `first_byte_timeout_ms`), and
//! after `eject_after_failures` resets, 5xx (throttling aside) or timed-out
//! probes in a row; never while it is the last of its namespace's
//! endpoints that is up. An ejected endpoint gets no requests until a
//! signed one-key listing sent to it every `probe_interval_ms` answers
//! within `probe_timeout_ms`.

use serde::Deserialize;

/// An invalid `[failover]` section.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FailoverConfigError {
    #[error("[failover] {0}")]
    Invalid(&'static str),
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FailoverConfig {
    /// The longest an endpoint may keep a request waiting without progress:
    /// for the first byte of its answer, between two chunks of a body it
    /// sends, or to take the next chunk of a body it is sent. Past it the
    /// request counts as a failure of that endpoint and goes to another one
    /// (a GET part resumes there from the bytes it already has). Keep it
    /// above the store's slowest answer (a listing of a large prefix, the
    /// completion of an upload of many parts). Requests carrying an RDMA
    /// token (whose answer waits for the one-sided transfer) keep only
    /// `[s3] read_timeout_ms`. Each retry of a request waits twice as long
    /// as the try before it (at most 8x): the one endpoint left up may be
    /// slow under the load that its dead partner's clients bring. 0 turns
    /// it off.
    pub first_byte_timeout_ms: u64,
    /// Resets, 5xx and timed-out probes in a row that eject an endpoint (a
    /// refused connection or a missed first-byte deadline ejects it at
    /// once).
    pub eject_after_failures: u32,
    /// How often an ejected endpoint is checked.
    pub probe_interval_ms: u64,
    /// Deadline of each check, and of the readiness probe of each endpoint.
    pub probe_timeout_ms: u64,
}

impl Default for FailoverConfig {
    fn default() -> Self {
        Self { first_byte_timeout_ms: 5000, eject_after_failures: 3, probe_interval_ms: 1000, probe_timeout_ms: 2000 }
    }
}

impl FailoverConfig {
    pub fn validate(&self) -> Result<(), FailoverConfigError> {
        if self.eject_after_failures == 0 {
            return Err(FailoverConfigError::Invalid("eject_after_failures must be >= 1"));
        }
        if self.probe_interval_ms < 10 || self.probe_timeout_ms == 0 {
            return Err(FailoverConfigError::Invalid("probe_interval_ms must be >= 10 and probe_timeout_ms >= 1"));
        }
        Ok(())
    }

    /// The first-byte deadline, `None` when off.
    pub fn first_byte_timeout(&self) -> Option<std::time::Duration> {
        (self.first_byte_timeout_ms > 0).then(|| std::time::Duration::from_millis(self.first_byte_timeout_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_limits() {
        let c: FailoverConfig = toml::from_str("").unwrap();
        assert_eq!(c, FailoverConfig::default());
        assert_eq!(c.first_byte_timeout(), Some(std::time::Duration::from_secs(5)));
        let off: FailoverConfig = toml::from_str("first_byte_timeout_ms = 0").unwrap();
        assert_eq!(off.first_byte_timeout(), None);
        let bad: FailoverConfig = toml::from_str("eject_after_failures = 0").unwrap();
        assert!(bad.validate().unwrap_err().to_string().contains("eject_after_failures"));
        assert!(toml::from_str::<FailoverConfig>("eject_after = 2").is_err(), "unknown keys are refused");
    }

    /// The example config's commented `[failover]` and `[uploads]`,
    /// uncommented, are valid (and show the defaults).
    #[test]
    fn the_example_sections_parse_uncommented() {
        const EXAMPLE: &str = include_str!("../../../deploy/agent.example.toml");
        let section = |name: &str| -> toml::Table {
            let text: String = EXAMPLE
                .lines()
                .skip_while(|l| *l != format!("# [{name}]"))
                .take_while(|l| l.starts_with('#'))
                .map(|l| format!("{}\n", l.trim_start_matches('#').trim_start()))
                .collect();
            toml::from_str::<toml::Table>(&text).unwrap()[name].as_table().unwrap().clone()
        };
        let failover: FailoverConfig = section("failover").try_into().unwrap();
        assert_eq!(failover, FailoverConfig::default());
        let uploads: super::super::uploads::UploadsConfig = section("uploads").try_into().unwrap();
        assert_eq!(uploads.abort_incomplete_after_days, Some(7));
    }
}
