//! The agent's domain types and limits: what config parses into and every
//! other module uses. It imports nothing from the crate, so it sits at the
//! bottom of the module layers (docs/architecture.md).

use serde::Deserialize;

/// Most items in one batch (the shim refuses bigger batches before they
/// get here; this is the agent's own bound).
pub const MAX_BATCH_ITEMS: usize = 4096;

/// Most parts of one multipart upload (S3's limit).
pub const MAX_PARTS: u64 = 10_000;

/// Largest S3 object (5 TiB).
pub const MAX_S3_OBJECT_BYTES: u64 = 5 << 40;

/// Largest single (not multipart) PUT S3 accepts (5 GiB).
pub const MAX_SINGLE_PUT_BYTES: u64 = 5 << 30;

/// Largest object a PUT can write with these part sizes: a single PUT up
/// to `multipart_threshold`, else at most [`MAX_PARTS`] parts of
/// `part_bytes` (plaintext bytes per part for encrypted namespaces).
pub fn max_object_bytes(multipart_threshold: u64, part_bytes: u64) -> u64 {
    MAX_PARTS.saturating_mul(part_bytes).max(multipart_threshold).min(MAX_S3_OBJECT_BYTES)
}

/// One right on a namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Permission {
    /// GET and HEAD.
    Read,
    /// PUT.
    Write,
    /// LIST.
    List,
    /// DELETE.
    Delete,
}

impl Permission {
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::List => "list",
            Self::Delete => "delete",
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DataPathMode {
    #[default]
    Http,
    Rdma,
    Auto,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Placement {
    #[default]
    Direct,
    Staged,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_object_follows_the_part_size() {
        // 8 MiB parts: 10,000 of them.
        assert_eq!(max_object_bytes(16 << 20, 8 << 20), 10_000 * (8 << 20));
        // 1 GiB parts would pass 5 TiB: S3's limit wins.
        assert_eq!(max_object_bytes(16 << 20, 1 << 30), MAX_S3_OBJECT_BYTES);
    }
}
