//! The agent's S3 access for one namespace: ranged, concurrent GETs into
//! host memory, single and multipart PUTs from host memory, HEAD,
//! ListObjectsV2 and DELETE, with retries across the namespace's endpoints,
//! the RDMA data path and inline encryption. Each S3 request goes through
//! an [`S3Client`] (SigV4 over HTTP in the agent; in memory in tests).

pub mod client;
pub mod crypto;
pub mod endpoints;
mod error;
#[cfg(test)]
mod failing;
mod first_byte;
mod get;
pub mod gpu;
mod guarded;
pub mod http_client;
pub mod integrity;
#[cfg(test)]
mod integrity_tests;
#[cfg(test)]
mod mock;
mod put;
pub mod setup;
mod sigv4;
pub mod store_tls;
pub mod token_path;
#[cfg(test)]
mod transfer_tests;
pub mod uploads;
mod xml;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub use client::S3Client;
use client::Target;

pub use error::S3Error;
pub use get::GetOutcome;
pub use put::PutOutcome;
pub use sigv4::Keys;
pub use xml::{ListPage, ObjectMeta};

use crate::config::{NamespaceConfig, S3Tuning};

/// Per-part admission of a transfer: its tenant's permit paces each part
/// (bytes/s) and takes a fair-scheduler slot for it, held while the part
/// moves, so one tenant's large transfer never holds the agent for longer
/// than a part. `None`: no quotas (tests of the S3 client alone).
pub type Gate<'a> = Option<&'a sluice_qos::Permit>;

/// Waits for `gate` to admit a part of `n` bytes.
async fn enter(gate: Gate<'_>, n: u64) -> Result<Option<sluice_qos::Slot>, S3Error> {
    match gate {
        Some(p) => p.chunk(n).await.map(Some).map_err(|e| S3Error::Quota(e.to_string())),
        None => Ok(None),
    }
}

/// The metrics an S3 client feeds.
#[derive(Clone)]
pub struct S3Counters {
    /// Requests retried after 5xx/throttling/connection errors.
    pub retries: prometheus::IntCounter,
    /// Multipart uploads aborted, by reason (`failed`, `cancelled`).
    pub multipart_aborts: prometheus::IntCounterVec,
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

/// One namespace's view of an S3 store: endpoints, bucket, key prefix,
/// region and credentials.
pub struct ObjectStore {
    /// Sends each S3 request: `raw` behind the endpoints' health, the
    /// first-byte deadline and the upload journal (`guarded`).
    client: Arc<dyn S3Client>,
    /// Sends without any of that (the health checks).
    raw: Arc<dyn S3Client>,
    endpoints: Vec<String>,
    /// Each endpoint's health, which picks where requests go.
    health: Arc<endpoints::EndpointSet>,
    /// Part of the encrypted objects' associated data.
    bucket: String,
    prefix: String,
    tuning: S3Tuning,
    next_endpoint: AtomicUsize,
    counters: S3Counters,
    /// The tenant this store serves (descriptors are bound to it).
    tenant: String,
    /// The RDMA data path, when the namespace uses one.
    rdma: Option<token_path::TokenPath>,
    /// The data path the config asks for (`rdma` may be `None` even so:
    /// the transport could not be had, see `degraded`).
    data_path: crate::config::DataPathMode,
    degraded: Option<token_path::Fallback>,
    access: Vec<crate::config::Permission>,
    /// Inline encryption, when the namespace has it.
    encryption: Option<crypto::Encryption>,
    /// The namespace's request deadline (and the most a caller may ask for).
    request_timeout: Duration,
    /// See `NamespaceConfig::verify_checksums`.
    verify_checksums: bool,
    /// What each endpoint does with checksums, learned from its replies.
    learned: integrity::Learned,
}

impl std::fmt::Debug for ObjectStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectStore")
            .field("endpoints", &self.endpoints)
            .field("bucket", &self.bucket)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl ObjectStore {
    /// Namespace `ns` of `tenant`, whose requests `client` sends.
    pub fn new(
        client: Arc<dyn S3Client>,
        ns: &NamespaceConfig,
        tenant: &str,
        tuning: S3Tuning,
        counters: S3Counters,
        rdma: Option<token_path::TokenPath>,
    ) -> Self {
        let endpoints: Vec<String> = ns.endpoints.iter().map(|e| e.trim_end_matches('/').to_owned()).collect();
        // Health of its own until `with_failover` shares the agent's.
        let registry = endpoints::EndpointRegistry::new(Default::default(), None);
        let (raw, health, client) = Self::guard(client, &registry, &endpoints, &ns.prefix, &tuning, &counters, None);
        Self {
            client,
            raw,
            health,
            endpoints,
            bucket: ns.bucket.clone(),
            prefix: ns.prefix.clone(),
            tuning,
            next_endpoint: AtomicUsize::new(0),
            counters,
            tenant: tenant.to_owned(),
            rdma,
            data_path: ns.data_path,
            degraded: None,
            access: ns.access.clone(),
            encryption: None,
            request_timeout: Duration::from_millis(ns.request_timeout_ms),
            verify_checksums: ns.verify_checksums,
            learned: integrity::Learned::new(ns.endpoints.iter().map(|e| e.trim_end_matches('/'))),
        }
    }

    /// `client` behind the health of `endpoints` in `registry`, its
    /// deadlines and the upload journal `uploads`: (raw, health, guarded).
    #[allow(clippy::type_complexity)]
    fn guard(
        client: Arc<dyn S3Client>,
        registry: &endpoints::EndpointRegistry,
        urls: &[String],
        prefix: &str,
        tuning: &S3Tuning,
        counters: &S3Counters,
        uploads: Option<uploads::UploadLog>,
    ) -> (Arc<dyn S3Client>, Arc<endpoints::EndpointSet>, Arc<dyn S3Client>) {
        let probe = endpoints::Probe { client: client.clone(), prefix: prefix.to_owned() };
        let health = Arc::new(registry.set(urls, probe));
        let first_byte = registry.policy().first_byte_timeout();
        let resumes = tuning.max_attempts.saturating_sub(1);
        let guarded = guarded::Guarded::new(
            client.clone(),
            health.clone(),
            first_byte,
            resumes,
            counters.retries.clone(),
            uploads,
        );
        (client, health, Arc::new(guarded))
    }

    /// Shares the agent's endpoint health (`registry`: its policy, metrics
    /// and checks) and journals this namespace's uploads in `uploads`.
    pub fn with_failover(
        mut self,
        registry: &endpoints::EndpointRegistry,
        uploads: Option<uploads::UploadLog>,
    ) -> Self {
        let (_, health, client) = Self::guard(
            self.raw.clone(),
            registry,
            &self.endpoints,
            &self.prefix,
            &self.tuning,
            &self.counters,
            uploads,
        );
        (self.health, self.client) = (health, client);
        self
    }

    /// The namespace's request deadline.
    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// Encrypts this namespace's objects.
    pub fn with_encryption(mut self, enc: Option<crypto::Encryption>) -> Self {
        self.encryption = enc;
        self
    }

    /// Whether objects are encrypted by the agent (their bytes then pass
    /// through it: staged, over HTTP).
    pub fn encrypted(&self) -> bool {
        self.encryption.is_some()
    }

    /// Whether the namespace's ACL grants `perm`.
    pub fn allows(&self, perm: crate::config::Permission) -> bool {
        self.access.contains(&perm)
    }

    /// Marks the namespace as running on a fallback transport (reported on
    /// every request).
    pub fn with_degraded(mut self, degraded: Option<token_path::Fallback>) -> Self {
        self.degraded = degraded;
        self
    }

    /// Why the configured transport is not the one in use, if it is not.
    pub fn degraded(&self) -> Option<&token_path::Fallback> {
        self.degraded.as_ref()
    }

    /// Where bytes go: the host region itself or a staging buffer.
    pub fn placement(&self) -> crate::config::Placement {
        self.rdma.as_ref().map_or(crate::config::Placement::Direct, |r| r.placement)
    }

    /// The configured data path (a failed request's metrics label).
    pub fn configured_data_path(&self) -> DataPathUsed {
        if self.rdma.is_some() {
            DataPathUsed::Rdma
        } else {
            DataPathUsed::Http
        }
    }

    /// Largest object a PUT can write here (see
    /// [`crate::capabilities::max_object_bytes`]): encrypted objects go in
    /// parts of whole chunks.
    pub fn max_object_bytes(&self) -> u64 {
        let Some(enc) = &self.encryption else {
            return crate::capabilities::max_object_bytes(self.tuning.multipart_threshold, self.tuning.put_part_size);
        };
        // Stored objects are ciphertext: a tag per chunk and a header more
        // than the plaintext, which must stay within S3's 5 TiB.
        let chunk = u64::from(enc.chunk_size);
        let tag = sluice_crypt::TAG_LEN as u64;
        let parts = crate::capabilities::max_object_bytes(
            self.tuning.multipart_threshold,
            (self.tuning.put_part_size / chunk).max(1) * chunk,
        );
        let stored = (crate::capabilities::MAX_S3_OBJECT_BYTES / (chunk + tag)).saturating_sub(1) * chunk;
        parts.min(stored)
    }

    /// What this namespace offers, as told to shims (capability exchange).
    pub fn capabilities(&self, name: &str) -> crate::capabilities::NamespaceCaps {
        let caps = self.rdma.as_ref().map(|r| r.transport.capabilities());
        crate::capabilities::NamespaceCaps {
            name: name.to_owned(),
            access: self.access.clone(),
            data_path: self.data_path,
            transport: caps.as_ref().map(|c| c.kind),
            degraded: self.degraded.as_ref().map(|d| format!("{}: {}", d.kind, d.message)),
            placement: self.placement(),
            encrypted: self.encryption.is_some(),
            max_object_bytes: self.max_object_bytes(),
            max_window_bytes: caps.map_or(0, |c| c.max_window_bytes),
            get_part_bytes: self.tuning.get_part_size,
            put_part_bytes: self.tuning.put_part_size,
            rdma_min_bytes: self.rdma.as_ref().map_or(0, |r| r.min_bytes),
            request_timeout: self.request_timeout,
            store_checksums: self.learned.summary(),
        }
    }

    /// The RDMA path to use for a transfer of `len` bytes, if any.
    fn rdma_for(&self, len: u64) -> Option<&token_path::TokenPath> {
        self.rdma.as_ref().filter(|r| len > 0 && (r.mode == crate::config::DataPathMode::Rdma || len >= r.min_bytes))
    }

    /// The key as stored: the namespace prefix plus the tenant's key.
    fn full_key(&self, key: &str) -> String {
        format!("{}{}", self.prefix, key)
    }

    /// Picks the endpoint for the `attempt`-th try of a request that started
    /// at `base`: round robin across the endpoints that are up (all of them
    /// when none is); retries move on.
    fn endpoint(&self, base: usize, attempt: u32) -> &str {
        self.health.pick(base + attempt as usize).url()
    }

    /// The `attempt`-th try at stored key `full` (see [`Self::endpoint`]).
    fn at<'a>(&'a self, base: usize, attempt: u32, full: &'a str, request_id: &'a str) -> Target<'a> {
        Target { endpoint: self.endpoint(base, attempt), key: full, request_id }
    }

    /// A fresh round-robin starting point.
    fn next_base(&self) -> usize {
        self.next_endpoint.fetch_add(1, Ordering::Relaxed)
    }

    /// Backoff before attempt `attempt` (1-based retries): base * 2^(n-1), with
    /// up to 50% jitter so that concurrent parts do not retry in lockstep.
    async fn backoff(&self, attempt: u32) {
        self.counters.retries.inc();
        let base = self.tuning.retry_base_ms.saturating_mul(1 << (attempt - 1).min(10));
        let mut b = [0u8; 2];
        let jitter = match ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b) {
            Ok(()) => u64::from(u16::from_le_bytes(b)) % (base / 2 + 1),
            Err(_) => 0,
        };
        tokio::time::sleep(Duration::from_millis(base + jitter)).await;
    }

    /// Runs `f` up to `max_attempts` times while it fails with a retryable
    /// error. `f` gets the attempt number (0-based).
    async fn retrying<T, F, Fut>(&self, mut f: F) -> Result<T, S3Error>
    where
        F: FnMut(u32) -> Fut,
        Fut: std::future::Future<Output = Result<T, S3Error>>,
    {
        let mut attempt = 0;
        loop {
            match f(attempt).await {
                Ok(v) => return Ok(v),
                // Retrying a completion another gateway holds cannot work.
                Err(e)
                    if e.is_retryable() && !endpoints::held_elsewhere(&e) && attempt + 1 < self.tuning.max_attempts =>
                {
                    attempt += 1;
                    tracing::warn!(error = %e, attempt, "S3 request failed; retrying");
                    // An endpoint that is gone (refused, reset, silent) is
                    // no reason to wait before trying another that is up;
                    // throttling and 5xx are.
                    if endpoints::classify(&e).is_some_and(|k| self.health.elsewhere_now(k)) {
                        self.counters.retries.inc();
                    } else {
                        self.backoff(attempt).await;
                    }
                }
                Err(e) => return Err(e.after_attempts(attempt + 1)),
            }
        }
    }

    /// HeadObject (plaintext size for encrypted objects).
    pub async fn head(&self, key: &str, request_id: &str) -> Result<ObjectMeta, S3Error> {
        if self.encryption.is_some() {
            return self.head_encrypted(key, request_id).await;
        }
        let full = &self.full_key(key);
        let base = self.next_base();
        self.retrying(|attempt| async move {
            let headers = self.client.head(self.at(base, attempt, full, request_id)).await?;
            xml::meta_from_headers(key, &headers)
        })
        .await
    }

    /// DeleteObject (S3 semantics: deleting a missing key succeeds).
    pub async fn delete(&self, key: &str, request_id: &str) -> Result<(), S3Error> {
        let full = &self.full_key(key);
        let base = self.next_base();
        self.retrying(|attempt| self.client.delete(self.at(base, attempt, full, request_id))).await
    }

    /// One page of ListObjectsV2 under the namespace prefix + `prefix`; keys come
    /// back without the namespace prefix.
    pub async fn list_page(
        &self,
        prefix: &str,
        continuation_token: &str,
        max_keys: u32,
        delimiter: &str,
        request_id: &str,
    ) -> Result<ListPage, S3Error> {
        let full_prefix = self.full_key(prefix);
        let base = self.next_base();
        let query = client::ListQuery { prefix: &full_prefix, continuation_token, max_keys, delimiter };
        let mut page = self.retrying(|attempt| self.client.list(self.at(base, attempt, "", request_id), query)).await?;
        // Strip the namespace prefix: tenants never see how they are laid out.
        for o in &mut page.objects {
            if let Some(k) = o.key.strip_prefix(&self.prefix) {
                o.key = k.to_owned();
            }
        }
        if let Some(enc) = &self.encryption {
            // Plaintext sizes: from the namespace's chunk size when the stored
            // size fits it, else from the object's metadata.
            for o in &mut page.objects {
                match sluice_crypt::plaintext_len(o.size, enc.chunk_size) {
                    Ok(n) => o.size = n,
                    Err(_) => o.size = self.head(&o.key, request_id).await.map(|m| m.size).unwrap_or(o.size),
                }
            }
        }
        for p in &mut page.common_prefixes {
            if let Some(k) = p.strip_prefix(&self.prefix) {
                *p = k.to_owned();
            }
        }
        Ok(page)
    }
}
