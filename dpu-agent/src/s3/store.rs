//! One namespace's view of an S3 store ([`ObjectStore`]): its endpoints,
//! bucket, prefix, data path and encryption, the retry loop every request
//! goes through, and HEAD, DELETE and LIST. GET, PUT and the rest are
//! `impl ObjectStore` blocks in the files named for them (`get.rs`,
//! `put.rs`, ...), which sit above this one.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::client::{self, header, S3Client, Target};
use super::encryption::Encryption;
use super::endpoints::{self, EndpointStatus, FailureKind, NotServing, Probe};
use super::error::S3Error;
use super::guarded;
use super::integrity::{self, multipart_etag, Digests, Proof, Upload};
use super::model::{DataPathUsed, ListPage, ObjectMeta};
use super::token_path::{Fallback, TokenPath};
use super::uploads::UploadLog;
use super::xml;
use crate::config::{NamespaceConfig, S3Tuning};

/// The metrics an S3 client feeds.
#[derive(Clone)]
pub struct S3Counters {
    /// Requests retried after 5xx/throttling/connection errors.
    pub retries: prometheus::IntCounter,
    /// Multipart uploads aborted, by reason (`failed`, `cancelled`).
    pub multipart_aborts: prometheus::IntCounterVec,
}

/// One namespace's view of an S3 store: endpoints, bucket, key prefix,
/// region and credentials.
pub struct ObjectStore {
    /// Sends each S3 request: `raw` behind the endpoints' health, the
    /// first-byte deadline and the upload journal (`guarded`).
    pub(super) client: Arc<dyn S3Client>,
    /// Sends without any of that (the health checks).
    pub(super) raw: Arc<dyn S3Client>,
    pub(super) endpoints: Vec<String>,
    /// Each endpoint's health, which picks where requests go.
    pub(super) health: Arc<endpoints::EndpointSet>,
    /// Part of the encrypted objects' associated data.
    pub(super) bucket: String,
    pub(super) prefix: String,
    pub(super) tuning: S3Tuning,
    pub(super) next_endpoint: AtomicUsize,
    pub(super) counters: S3Counters,
    /// The tenant this store serves (descriptors are bound to it).
    pub(super) tenant: String,
    /// The RDMA data path, when the namespace uses one.
    pub(super) rdma: Option<TokenPath>,
    /// The data path the config asks for (`rdma` may be `None` even so:
    /// the transport could not be had, see `degraded`).
    pub(super) data_path: crate::model::DataPathMode,
    pub(super) degraded: Option<Fallback>,
    pub(super) access: Vec<crate::model::Permission>,
    /// Inline encryption, when the namespace has it.
    pub(super) encryption: Option<Encryption>,
    /// The namespace's request deadline (and the most a caller may ask for).
    pub(super) request_timeout: Duration,
    /// See `NamespaceConfig::verify_checksums`.
    pub(super) verify_checksums: bool,
    /// What each endpoint does with checksums, learned from its replies.
    pub(super) learned: integrity::Learned,
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
        rdma: Option<TokenPath>,
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
    pub(super) fn guard(
        client: Arc<dyn S3Client>,
        registry: &endpoints::EndpointRegistry,
        urls: &[String],
        prefix: &str,
        tuning: &S3Tuning,
        counters: &S3Counters,
        uploads: Option<UploadLog>,
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
    pub fn with_failover(mut self, registry: &endpoints::EndpointRegistry, uploads: Option<UploadLog>) -> Self {
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
    pub fn with_encryption(mut self, enc: Option<Encryption>) -> Self {
        self.encryption = enc;
        self
    }

    /// Whether objects are encrypted by the agent (their bytes then pass
    /// through it: staged, over HTTP).
    pub fn encrypted(&self) -> bool {
        self.encryption.is_some()
    }

    /// Whether the namespace's ACL grants `perm`.
    pub fn allows(&self, perm: crate::model::Permission) -> bool {
        self.access.contains(&perm)
    }

    /// Marks the namespace as running on a fallback transport (reported on
    /// every request).
    pub fn with_degraded(mut self, degraded: Option<Fallback>) -> Self {
        self.degraded = degraded;
        self
    }

    /// Why the configured transport is not the one in use, if it is not.
    pub fn degraded(&self) -> Option<&Fallback> {
        self.degraded.as_ref()
    }

    /// Where bytes go: the host region itself or a staging buffer.
    pub fn placement(&self) -> crate::model::Placement {
        self.rdma.as_ref().map_or(crate::model::Placement::Direct, |r| r.placement)
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
    /// [`crate::model::max_object_bytes`]): encrypted objects go in
    /// parts of whole chunks.
    pub fn max_object_bytes(&self) -> u64 {
        let Some(enc) = &self.encryption else {
            return crate::model::max_object_bytes(self.tuning.multipart_threshold, self.tuning.put_part_size);
        };
        // Stored objects are ciphertext: a tag per chunk and a header more
        // than the plaintext, which must stay within S3's 5 TiB.
        let chunk = u64::from(enc.chunk_size);
        let tag = sluice_crypt::TAG_LEN as u64;
        let parts = crate::model::max_object_bytes(
            self.tuning.multipart_threshold,
            chunks_per_part(self.tuning.put_part_size, enc.chunk_size) * chunk,
        );
        let stored = (crate::model::MAX_S3_OBJECT_BYTES / (chunk + tag)).saturating_sub(1) * chunk;
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
    pub(super) fn rdma_for(&self, len: u64) -> Option<&TokenPath> {
        self.rdma.as_ref().filter(|r| len > 0 && (r.mode == crate::model::DataPathMode::Rdma || len >= r.min_bytes))
    }

    /// The key as stored: the namespace prefix plus the tenant's key.
    pub(super) fn full_key(&self, key: &str) -> String {
        format!("{}{}", self.prefix, key)
    }

    /// Picks the endpoint for the `attempt`-th try of a request that started
    /// at `base`: round robin across the endpoints that are up (all of them
    /// when none is); retries move on.
    pub(super) fn endpoint(&self, base: usize, attempt: u32) -> &str {
        self.health.pick(base + attempt as usize).url()
    }

    /// The `attempt`-th try at stored key `full` (see [`Self::endpoint`]).
    pub(super) fn at<'a>(&'a self, base: usize, attempt: u32, full: &'a str, request_id: &'a str) -> Target<'a> {
        Target { endpoint: self.endpoint(base, attempt), key: full, request_id, attempt }
    }

    /// A fresh round-robin starting point.
    pub(super) fn next_base(&self) -> usize {
        self.next_endpoint.fetch_add(1, Ordering::Relaxed)
    }

    /// Backoff before attempt `attempt` (1-based retries): base * 2^(n-1), with
    /// up to 50% jitter so that concurrent parts do not retry in lockstep.
    pub(super) async fn backoff(&self, attempt: u32) {
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
    pub(super) async fn retrying<T, F, Fut>(&self, mut f: F) -> Result<T, S3Error>
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
        self.head_from(key, request_id, self.next_base()).await
    }

    /// HeadObject starting at endpoint `base` (a GET's HEAD goes next to
    /// the endpoint of its first part, without taking a base of its own:
    /// see `first_part_rdma`).
    pub(super) async fn head_from(&self, key: &str, request_id: &str, base: usize) -> Result<ObjectMeta, S3Error> {
        let full = &self.full_key(key);
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
            self.plaintext_sizes(enc, &mut page, request_id).await?;
        }
        for p in &mut page.common_prefixes {
            if let Some(k) = p.strip_prefix(&self.prefix) {
                *p = k.to_owned();
            }
        }
        Ok(page)
    }

    /// Gives the listed objects of an encrypted namespace their plaintext
    /// sizes: from the stored size where the namespace's chunk sizes make
    /// it unambiguous, else from each object's metadata (HEADs, several at
    /// once). An object deleted since the listing is left out; one that is
    /// not a sealed object keeps its stored size (its GET is refused);
    /// any other failure fails the page rather than list a wrong size.
    async fn plaintext_sizes(&self, enc: &Encryption, page: &mut ListPage, request_id: &str) -> Result<(), S3Error> {
        use futures::StreamExt;
        let mut ask = Vec::new();
        for (i, o) in page.objects.iter_mut().enumerate() {
            match enc.size_from_listing(o.size) {
                Some(n) => o.size = n,
                None => ask.push((i, o.key.clone())),
            }
        }
        let heads: Vec<_> = futures::stream::iter(ask)
            .map(|(i, key)| async move { (i, self.head(&key, request_id).await) })
            .buffer_unordered(self.tuning.max_concurrency.max(1))
            .collect()
            .await;
        let mut gone = Vec::new();
        for (i, head) in heads {
            match head {
                Ok(m) => page.objects[i].size = m.size,
                Err(S3Error::NoSuchKey(_)) => gone.push(i),
                Err(e @ S3Error::Integrity(_)) => {
                    tracing::warn!(key = %page.objects[i].key, error = %e,
                        "a listed object cannot be read in this encrypted namespace; listed with its stored size");
                }
                Err(e) => return Err(e),
            }
        }
        gone.sort_unstable();
        for i in gone.into_iter().rev() {
            page.objects.remove(i);
        }
        Ok(())
    }
}

impl ObjectStore {
    /// Each endpoint's health, for `/ready`.
    pub fn endpoint_status(&self) -> Vec<EndpointStatus> {
        self.health.status()
    }

    /// The readiness probe: a one-key listing through each endpoint at
    /// once, each within `timeout` (a hung endpoint fails its own probe,
    /// not the namespace's). Endpoints that fail it count it against
    /// their health; an ejected one that passes is back. `Err` for an
    /// endpoint: why it does not serve this namespace.
    pub async fn probe_endpoints(&self, timeout: Duration) -> Vec<(String, Result<(), NotServing>)> {
        let probe = Probe { client: self.raw.clone(), prefix: self.prefix.clone() };
        let runs = self.health.members.iter().map(|e| {
            let probe = &probe;
            async move {
                let r = match probe.run(e.url(), timeout).await {
                    Ok(answer) => {
                        e.check_passed();
                        answer.map_err(|err| NotServing::Namespace(err.to_string()))
                    }
                    Err((kind, err)) => {
                        let kind = if kind == FailureKind::Deadline { FailureKind::ProbeDeadline } else { kind };
                        self.health.failed(e, kind, &err);
                        Err(NotServing::Endpoint(err))
                    }
                };
                (e.url().to_owned(), r)
            }
        });
        futures::future::join_all(runs).await
    }
}

impl ObjectStore {
    /// What `endpoint`'s reply to an upload proved, and what it taught
    /// about the endpoint (whether it echoes, so checks, the CRC).
    pub(super) fn upload_proof(
        &self,
        endpoint: &str,
        kind: Upload,
        digests: &Digests,
        reply: &http::HeaderMap,
    ) -> Result<Proof, S3Error> {
        let proof = digests.check_reply(reply)?;
        self.learned.upload_reply(endpoint, kind, proof.echoed);
        Ok(proof)
    }

    /// The ETag of a multipart object whose completion came back without
    /// one (RGW 16.2's): S3's, from the parts' MD5s when every part has
    /// one (exactly this upload's, whoever writes the key next), else what
    /// HEAD says. The object is stored either way, so a failed HEAD leaves
    /// the ETag empty rather than failing the PUT.
    pub(super) async fn etag_of_completed(
        &self,
        full: &str,
        base: usize,
        request_id: &str,
        md5s: &[Option<[u8; 16]>],
    ) -> String {
        if let Some(all) = md5s.iter().copied().collect::<Option<Vec<_>>>().filter(|m| !m.is_empty()) {
            return multipart_etag(&all);
        }
        let head = self
            .retrying(|attempt| async move {
                let h = self.client.head(self.at(base, attempt, full, request_id)).await?;
                Ok(header(&h, "etag").to_owned())
            })
            .await;
        head.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "the store completed the upload without an ETag, and HEAD failed");
            String::new()
        })
    }
}

/// Whole chunks in each part of an encrypted multipart upload: the part
/// size rounded up to whole chunks. Rounded down, a part size of 6 MiB over
/// 4 MiB chunks made 4 MiB parts, below S3's 5 MiB minimum, and every such
/// upload failed at its completion, after all its bytes were sent.
pub(super) fn chunks_per_part(put_part_size: u64, chunk_size: u32) -> u64 {
    put_part_size.div_ceil(u64::from(chunk_size).max(1)).max(1)
}
