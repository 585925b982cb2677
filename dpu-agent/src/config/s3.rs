//! `[[tenants.namespaces]]` and `[s3]`: where a namespace's objects live
//! (endpoints, bucket, prefix, credentials), how their bytes move (data
//! path, transport, placement, encryption), and how the agent talks to S3.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;
use sluice_crypt::EncryptionPolicy;
use sluice_dataplane::transport::TransportKind;

use super::credentials::CredentialConfig;
use crate::model::{DataPathMode, Permission, Placement, MAX_SINGLE_PUT_BYTES};

/// An invalid namespace.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NamespaceConfigError {
    #[error("namespace {namespace:?}: at least one endpoint")]
    NoEndpoint { namespace: String },
    #[error("namespace {namespace:?}: endpoint {endpoint:?} must start with http:// or https://")]
    EndpointScheme { namespace: String, endpoint: String },
    #[error("namespace {namespace:?}: bucket is empty")]
    EmptyBucket { namespace: String },
    #[error("namespace {namespace:?}: request_timeout_ms must be > 0")]
    RequestTimeout { namespace: String },
    #[error("namespace {namespace:?}: transport \"dc\" needs [dataplane.dc]")]
    NoDcSection { namespace: String },
    #[error("namespace {namespace:?}: transport \"verbs-rc\" needs [dataplane] verbs_listen")]
    NoVerbsListen { namespace: String },
    #[error("namespace {namespace:?}: encryption needs [encryption] key_dir")]
    NoKeyDir { namespace: String },
    #[error(
        "namespace {namespace:?}: encryption_chunk_bytes (and encryption_previous_chunk_bytes) must be powers of two \
         from 4 KiB to 16 MiB"
    )]
    ChunkSize { namespace: String },
    #[error("namespace {namespace:?}: credentials {credentials:?} not found in [credentials]")]
    UnknownCredentials { namespace: String, credentials: String },
}

/// An invalid `[s3]` section.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum S3TuningError {
    #[error("s3: get_part_size > 0, put_part_size >= 5 MiB, max_concurrency >= 1, max_attempts >= 1")]
    Sizes,
    #[error("s3: multipart_threshold must be >= put_part_size")]
    ThresholdBelowPart,
    #[error("s3: multipart_threshold and put_part_size must be <= {max} (S3's largest PUT)")]
    AboveSinglePut { max: u64 },
    #[error("s3: with encrypted namespaces put_part_size must be <= {max} (parts grow by a tag per chunk)")]
    EncryptedPart { max: u64 },
    #[error("s3: with RDMA namespaces, get_part_size and multipart_threshold must be <= {window} (one descriptor)")]
    AboveWindow { window: u64 },
    #[error(
        "s3: get_part_size must be <= {max} (with encrypted namespaces 1 GiB: each part in flight is held in the \
         agent's memory while it is decrypted)"
    )]
    GetPart { max: u64 },
}

/// What a namespace may refer to in the rest of the config.
pub struct NamespaceRefs<'a> {
    /// `[dataplane.dc]` is set.
    pub dc: bool,
    /// `[dataplane] verbs_listen` is set.
    pub verbs_listen: bool,
    /// `[encryption] key_dir` is set.
    pub key_dir: bool,
    pub credentials: &'a BTreeMap<String, CredentialConfig>,
}

/// A namespace's request deadline when its config does not set one.
pub const DEFAULT_REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

/// How the agent talks to S3.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct S3Tuning {
    /// GETs larger than this are split into ranged GETs of this size.
    pub get_part_size: u64,
    /// PUTs larger than this use multipart upload.
    pub multipart_threshold: u64,
    /// Part size for multipart upload (S3 minimum: 5 MiB except the last).
    pub put_part_size: u64,
    /// Ranged GETs / parts in flight per request.
    pub max_concurrency: usize,
    /// Attempts per S3 request (1 = no retry). Only 5xx, throttling and
    /// connection errors are retried; 4xx never are.
    pub max_attempts: u32,
    /// First retry delay; doubles each attempt (with jitter).
    pub retry_base_ms: u64,
    /// Connect timeout.
    pub connect_timeout_ms: u64,
    /// Longest silence on a connection before the request fails.
    pub read_timeout_ms: u64,
    /// Data GETs to `http://` endpoints on the agent's own HTTP/1.1
    /// connections, bodies read from the socket straight into the region
    /// (one copy fewer than through the general client). `false`: every
    /// request through the general client.
    pub direct_gets: bool,
}

impl Default for S3Tuning {
    fn default() -> Self {
        Self {
            get_part_size: 8 << 20,
            multipart_threshold: 16 << 20,
            put_part_size: 8 << 20,
            max_concurrency: 8,
            max_attempts: 4,
            retry_base_ms: 50,
            connect_timeout_ms: 3000,
            read_timeout_ms: 30_000,
            direct_gets: true,
        }
    }
}

impl S3Tuning {
    /// Checks the sizes, for a config with any `encrypted` namespace and
    /// any `rdma` one.
    pub fn validate(&self, encrypted: bool, rdma: bool) -> Result<(), S3TuningError> {
        if self.get_part_size == 0
            || self.put_part_size < 5 << 20
            || self.max_concurrency == 0
            || self.max_attempts == 0
        {
            return Err(S3TuningError::Sizes);
        }
        if self.multipart_threshold < self.put_part_size {
            return Err(S3TuningError::ThresholdBelowPart);
        }
        // An encrypted part's ciphertext is held whole while it is opened
        // (times `max_concurrency`); no store serves one range the faster
        // for being larger than a part it could take in a PUT.
        let get_max = if encrypted { 1 << 30 } else { MAX_SINGLE_PUT_BYTES };
        if self.get_part_size > get_max {
            return Err(S3TuningError::GetPart { max: get_max });
        }
        // S3 refuses single PUTs and parts above 5 GiB: the store would
        // refuse them only once the bytes were on the wire.
        if self.multipart_threshold > MAX_SINGLE_PUT_BYTES || self.put_part_size > MAX_SINGLE_PUT_BYTES {
            return Err(S3TuningError::AboveSinglePut { max: MAX_SINGLE_PUT_BYTES });
        }
        // Encrypted parts are ciphertext: a 16-byte tag per chunk more (at
        // most 1/256 of 4 KiB chunks), which 4 GiB of plaintext leaves room for.
        if encrypted && self.put_part_size > 4 << 30 {
            return Err(S3TuningError::EncryptedPart { max: 4 << 30 });
        }
        // One descriptor describes at most 4 GiB - 64 KiB: RDMA parts and
        // single PUTs must fit, larger objects go as a series of parts.
        let window = sluice_dataplane::transport::MAX_WINDOW_BYTES;
        if rdma && (self.get_part_size > window || self.multipart_threshold > window) {
            return Err(S3TuningError::AboveWindow { window });
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamespaceConfig {
    /// The name the tenant uses (`name/key`).
    pub name: String,
    /// One or more S3 endpoints (`http://host:port`) serving the same data.
    pub endpoints: Vec<String>,
    /// PEM CA certificate(s) trusted for the https:// endpoints besides the
    /// built-in and system roots (`s3::store_tls`); relative to this file.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    pub bucket: String,
    /// Prepended to every key; lets tenants share a bucket without overlap.
    #[serde(default)]
    pub prefix: String,
    #[serde(default = "default_region")]
    pub region: String,
    /// Name of an entry in `[credentials]`.
    pub credentials: String,
    /// How object bytes move: `http` (the body), `rdma` (x-amz-rdma-token on
    /// every GET part and PUT), or `auto` (RDMA for parts of at least
    /// `rdma_min_bytes`, HTTP below; the first GET part, which learns the
    /// object's size, goes over HTTP). RDMA falls back to HTTP loudly.
    #[serde(default)]
    pub data_path: DataPathMode,
    /// The one-sided transport the endpoints serve: `tcp` (software),
    /// `verbs-rc` (RDMA reliable connections, needs `[dataplane]
    /// verbs_listen`) or `dc` (mlx5 DC, the standard token; needs
    /// `[dataplane.dc]`). Tokens are only ever sent to endpoints configured
    /// for their transport.
    #[serde(default, deserialize_with = "from_name")]
    pub transport: TransportKind,
    /// `direct`: the store writes into / reads from the host region itself.
    /// `staged`: through an agent-side buffer, copied into the region after
    /// each part (encrypted namespaces never use RDMA; they are staged over
    /// HTTP, where the agent decrypts).
    #[serde(default)]
    pub placement: Placement,
    /// In `auto` mode, parts smaller than this go over HTTP.
    #[serde(default = "default_rdma_min")]
    pub rdma_min_bytes: u64,
    /// What the tenant may do here: any of "read", "write", "list", "delete".
    #[serde(default = "all_permissions")]
    pub access: Vec<Permission>,
    /// `none` (default) or `aes-256-gcm`: the agent encrypts on PUT and
    /// decrypts on GET under the tenant's master key; bytes then pass
    /// through the agent (staged, over HTTP). See docs/encryption-format.md.
    #[serde(default, deserialize_with = "from_name")]
    pub encryption: EncryptionPolicy,
    /// Plaintext bytes per sealed chunk for new objects (power of two,
    /// 4 KiB..16 MiB). Ranged GETs decrypt whole chunks.
    #[serde(default = "default_encryption_chunk")]
    pub encryption_chunk_bytes: u32,
    /// Chunk sizes this namespace's objects were sealed with before
    /// `encryption_chunk_bytes` was changed. A listing gives each object's
    /// plaintext size from its stored size, which is exact only knowing the
    /// chunk size; where these sizes make it ambiguous, the object's own
    /// metadata is read (a HEAD each).
    #[serde(default)]
    pub encryption_previous_chunk_bytes: Vec<u32>,
    /// End-to-end deadline of a request in this namespace, and the most a
    /// caller may ask for (callers may ask for less). A request past it is
    /// cancelled and fails with DEADLINE_EXCEEDED.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// Check whole-object GETs against the object's CRC64NVME (the store's,
    /// and the one the agent keeps in the object's metadata: see
    /// docs/integrity.md): damaged bytes fail with INTEGRITY. HTTP parts
    /// are summed as they stream; RDMA parts are read back once.
    #[serde(default = "yes")]
    pub verify_checksums: bool,
}

fn yes() -> bool {
    true
}

fn default_request_timeout_ms() -> u64 {
    DEFAULT_REQUEST_TIMEOUT.as_millis() as u64
}

fn default_encryption_chunk() -> u32 {
    sluice_crypt::DEFAULT_CHUNK_SIZE
}

impl NamespaceConfig {
    /// Checks the namespace's values and what it refers to in `refs`.
    pub fn validate(&self, refs: &NamespaceRefs<'_>) -> Result<(), NamespaceConfigError> {
        let namespace = || self.name.clone();
        if self.endpoints.is_empty() {
            return Err(NamespaceConfigError::NoEndpoint { namespace: namespace() });
        }
        if let Some(e) = self.endpoints.iter().find(|e| !(e.starts_with("http://") || e.starts_with("https://"))) {
            return Err(NamespaceConfigError::EndpointScheme { namespace: namespace(), endpoint: e.clone() });
        }
        if self.bucket.is_empty() {
            return Err(NamespaceConfigError::EmptyBucket { namespace: namespace() });
        }
        if self.request_timeout_ms == 0 {
            return Err(NamespaceConfigError::RequestTimeout { namespace: namespace() });
        }
        let one_sided = self.data_path != DataPathMode::Http;
        if one_sided && self.transport == TransportKind::Dc && !refs.dc {
            return Err(NamespaceConfigError::NoDcSection { namespace: namespace() });
        }
        if one_sided && self.transport == TransportKind::VerbsRc && !refs.verbs_listen {
            return Err(NamespaceConfigError::NoVerbsListen { namespace: namespace() });
        }
        if self.encryption == EncryptionPolicy::Aes256Gcm && !refs.key_dir {
            return Err(NamespaceConfigError::NoKeyDir { namespace: namespace() });
        }
        let chunk_sizes = std::iter::once(&self.encryption_chunk_bytes).chain(&self.encryption_previous_chunk_bytes);
        if chunk_sizes.into_iter().any(|&c| sluice_crypt::check_chunk_size(u64::from(c)).is_err()) {
            return Err(NamespaceConfigError::ChunkSize { namespace: namespace() });
        }
        if !refs.credentials.contains_key(&self.credentials) {
            return Err(NamespaceConfigError::UnknownCredentials {
                namespace: namespace(),
                credentials: self.credentials.clone(),
            });
        }
        Ok(())
    }
}

fn all_permissions() -> Vec<Permission> {
    vec![Permission::Read, Permission::Write, Permission::List, Permission::Delete]
}

/// A config value by its name (`FromStr`), with the type's own error
/// (which lists the names it knows).
fn from_name<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
{
    let name = String::deserialize(d)?;
    name.parse().map_err(serde::de::Error::custom)
}

fn default_rdma_min() -> u64 {
    1 << 20
}

fn default_region() -> String {
    "us-east-1".into()
}
