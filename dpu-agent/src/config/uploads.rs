//! `[uploads]` and `state_dir`: the multipart uploads an agent leaves
//! behind when it dies mid-PUT. The agent journals every upload it starts
//! in `state_dir` and aborts those still open when it starts again
//! (`s3::uploads`); optionally it also gives each namespace's bucket a
//! lifecycle rule that aborts incomplete uploads after some days, for the
//! uploads a lost journal can no longer name.

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Where the journal lives when `state_dir` is not set.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/sluice/agent";

/// An invalid `[uploads]` section.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UploadsConfigError {
    #[error("[uploads] abort_incomplete_after_days must be >= 1 (omit it to leave the buckets' lifecycle alone)")]
    Days,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UploadsConfig {
    /// Adds to each namespace's bucket, scoped to the namespace's prefix, a
    /// lifecycle rule aborting multipart uploads still incomplete this many
    /// days after they started (the rules already there are kept). Absent:
    /// the agent never touches a bucket's lifecycle, which is the bucket
    /// owner's to decide; the agent's credentials then need no
    /// `s3:PutLifecycleConfiguration`.
    pub abort_incomplete_after_days: Option<u32>,
}

impl UploadsConfig {
    pub fn validate(&self) -> Result<(), UploadsConfigError> {
        match self.abort_incomplete_after_days {
            Some(0) => Err(UploadsConfigError::Days),
            _ => Ok(()),
        }
    }
}

/// The state directory `state_dir` names (relative to the config file),
/// and whether the config named it: the default one is used only if it can
/// be (a warning otherwise), a configured one must be.
pub fn state_dir(configured: Option<&Path>) -> (PathBuf, bool) {
    match configured {
        Some(p) => (p.to_owned(), true),
        None => (PathBuf::from(DEFAULT_STATE_DIR), false),
    }
}
