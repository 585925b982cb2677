//! What the S3 layer hands back and is told: object metadata, list pages,
//! the path bytes took, what a store does with checksums. Plain data, at
//! the bottom of `s3`: every other file of it may use these, and these use
//! none of them.

/// Object metadata as listed or HEADed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectMeta {
    pub key: String,
    pub size: u64,
    pub etag: String,
    pub last_modified_unix_ms: i64,
    pub content_type: String,
    /// The store's full-object CRC64NVME, when it offers one (HEAD with
    /// `x-amz-checksum-mode: ENABLED`).
    pub crc64nvme: Option<u64>,
    /// The CRC64NVME the agent kept in the object's metadata, if it wrote
    /// the object (see `s3::integrity`).
    pub agent_crc64nvme: Option<u64>,
}

/// One ListObjectsV2 page.
#[derive(Debug, Default)]
pub struct ListPage {
    pub objects: Vec<ObjectMeta>,
    pub common_prefixes: Vec<String>,
    /// Empty on the last page.
    pub next_continuation_token: String,
}

/// The path a transfer's bytes took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataPathUsed {
    /// Plain HTTP (also every fallback).
    Http,
    /// RDMA straight into the caller's region.
    Rdma,
    /// RDMA through a staging buffer on the agent.
    RdmaStaged,
}

impl DataPathUsed {
    /// The metrics label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Http => "http",
            Self::Rdma => "rdma",
            Self::RdmaStaged => "rdma-staged",
        }
    }
}

/// What a namespace's store does with `x-amz-checksum-crc64nvme`, as
/// learned from its replies so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreChecksums {
    /// No reply has told yet.
    Unknown,
    /// It checks the checksum on PUT, keeps it and returns it on GET.
    Kept,
    /// It neither keeps nor returns it (so it does not check it either).
    Ignored,
}

impl StoreChecksums {
    /// As `sluice stat --caps` and the logs spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unknown => "unknown",
            Self::Kept => "kept",
            Self::Ignored => "ignored",
        }
    }
}
