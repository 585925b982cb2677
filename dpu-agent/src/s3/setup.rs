//! Building the namespaces' stores at startup: the parts they share (the
//! HTTP connection pools, one per trusted `ca_file`; the master keys; the
//! chunk cipher: ring, or the DPU's DOCA engine after its self-test) and
//! each namespace's [`ObjectStore`] with its credentials, data path and
//! encryption.

use std::sync::Arc;

use super::client::S3Client;
use super::encryption::Encryption;
use super::endpoints::{EndpointMetrics, EndpointRegistry};
use super::http_client::HttpClient;
use super::sigv4::Keys;
use super::store::{ObjectStore, S3Counters};
use super::store_tls::PoolsError;
use super::token_path::TokenPath;
use super::uploads::{Journal, UploadLog};
use crate::config::{AgentConfig, CipherEngine, EncryptionConfig, NamespaceConfig};
use crate::transports::Chosen;

/// Why the namespaces' stores cannot be built (the agent does not start).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreSetupError {
    #[error(transparent)]
    Pools(#[from] super::store_tls::PoolsError),
    #[error("[encryption] key_dir: {0}")]
    KeyDir(#[source] sluice_crypt::CryptError),
    #[error("namespace {namespace:?}: encryption = \"aes-256-gcm\" needs [encryption] key_dir")]
    NoKeyDir { namespace: String },
    #[error("[encryption] engine = \"doca\": {0}")]
    DocaCipher(String),
    #[error("namespace {namespace:?}: credentials {name:?} are not defined under [credentials]")]
    MissingCredentials { namespace: String, name: String },
    #[error("credentials {name:?}: {source}")]
    Secret { name: String, source: crate::config::SecretError },
    /// The configured `state_dir` cannot hold the upload journal.
    #[error("state_dir: {0}")]
    StateDir(#[from] super::uploads::UploadsError),
}

/// What every namespace's store shares.
pub struct StoreParts {
    /// Connection pools, by the `ca_file` their namespaces trust.
    http: super::store_tls::Pools,
    keys: Option<Arc<dyn sluice_crypt::KeyProvider>>,
    cipher: Arc<dyn sluice_crypt::Cipher>,
    counters: S3Counters,
    failover: Arc<Failover>,
}

/// What every namespace's store shares to ride out the death of one of
/// its endpoints (their health) and of the agent itself (the journal of
/// the multipart uploads it has open).
pub struct Failover {
    pub registry: Arc<EndpointRegistry>,
    /// `None`: `state_dir` was not set and its default cannot be used.
    /// The uploads the last run left open are in it, to be aborted once
    /// every store exists (`uploads::sweep_forever`).
    pub journal: Option<Arc<Journal>>,
}

impl Failover {
    /// The endpoints' health (reported in `metrics`) and the journal in
    /// `state_dir`, which must be usable when the config names it; its
    /// default is used only if it can be.
    pub fn from_config(cfg: &AgentConfig, metrics: Option<EndpointMetrics>) -> Result<Self, StoreSetupError> {
        let registry = EndpointRegistry::new(cfg.failover.clone(), metrics);
        let (dir, named) = crate::config::uploads::state_dir(cfg.state_dir.as_deref());
        let journal = match Journal::open(&dir) {
            Ok((journal, _left)) => Some(journal),
            Err(e) if !named => {
                tracing::warn!(error = %e, "no multipart upload journal: uploads an agent killed mid-PUT leaves are \
                    not aborted when it restarts; set state_dir to a directory the agent can write");
                None
            }
            Err(e) => return Err(e.into()),
        };
        Ok(Self { registry, journal })
    }
}

impl StoreParts {
    pub fn from_config(
        cfg: &AgentConfig,
        counters: S3Counters,
        failover: Arc<Failover>,
    ) -> Result<Self, StoreSetupError> {
        let http = super::store_tls::Pools::from_config(cfg)?;
        super::store_tls::warn_plaintext_stores(cfg);
        let keys: Option<Arc<dyn sluice_crypt::KeyProvider>> = match &cfg.encryption.key_dir {
            Some(dir) => Some(Arc::new(sluice_crypt::FileKeyProvider::new(dir).map_err(StoreSetupError::KeyDir)?)),
            None => None,
        };
        let cipher = chunk_cipher(&cfg.encryption)?;
        Ok(Self { http, keys, cipher, counters, failover })
    }
}

impl ObjectStore {
    /// Namespace `ns` of `tenant`, moving bytes over `chosen`'s transport
    /// (`None`: HTTP; degraded when that is a fallback), its requests
    /// signed over HTTP. Its secret is read here and kept only in memory.
    /// Also returns the client that signs its requests, whose keys rotate
    /// on SIGHUP.
    pub fn for_namespace(
        parts: &StoreParts,
        cfg: &AgentConfig,
        tenant: &str,
        ns: &NamespaceConfig,
        chosen: Chosen,
    ) -> Result<(Self, Arc<HttpClient>), StoreSetupError> {
        let cred = cfg.credentials.get(&ns.credentials).ok_or_else(|| StoreSetupError::MissingCredentials {
            namespace: ns.name.clone(),
            name: ns.credentials.clone(),
        })?;
        let keys = keys(cred).map_err(|source| StoreSetupError::Secret { name: ns.credentials.clone(), source })?;
        let http =
            parts.http.for_namespace(ns).map_err(|source| PoolsError::CaFile { namespace: ns.name.clone(), source })?;
        let client = HttpClient::new(http, ns.bucket.clone(), keys, ns.region.clone())
            .with_first_byte_timeout(cfg.failover.first_byte_timeout())
            .with_direct_gets(parts.http.direct());
        let client = Arc::new(client);
        Ok((Self::on_client(parts, cfg, tenant, ns, chosen, client.clone())?, client))
    }

    /// Namespace `ns` of `tenant` as [`Self::for_namespace`] builds it,
    /// but sending its requests through `client`: any [`S3Client`] (an
    /// in-memory store, a failure-injecting wrapper: `Agent::from_parts`).
    pub fn on_client(
        parts: &StoreParts,
        cfg: &AgentConfig,
        tenant: &str,
        ns: &NamespaceConfig,
        chosen: Chosen,
        client: Arc<dyn S3Client>,
    ) -> Result<Self, StoreSetupError> {
        let Chosen { transport, degraded } = chosen;
        let rdma = transport.map(|(transport, kind)| TokenPath {
            transport,
            kind,
            mode: ns.data_path,
            placement: ns.placement,
            min_bytes: ns.rdma_min_bytes,
        });
        let store = Self::new(client, ns, tenant, cfg.s3.clone(), parts.counters.clone(), rdma);
        let encryption = Encryption::for_namespace(ns, &parts.keys, &parts.cipher)?;
        let uploads = parts
            .failover
            .journal
            .as_ref()
            .map(|j| UploadLog::new(j.clone(), &format!("{tenant}/{}", ns.name), &ns.bucket));
        let store = store.with_failover(&parts.failover.registry, uploads);
        Ok(store.with_degraded(degraded).with_encryption(encryption))
    }
}

impl Encryption {
    /// A namespace's encryption, if it has it (its tenant's master keys come
    /// from `keys`; without them the agent does not start).
    pub fn for_namespace(
        ns: &NamespaceConfig,
        keys: &Option<Arc<dyn sluice_crypt::KeyProvider>>,
        cipher: &Arc<dyn sluice_crypt::Cipher>,
    ) -> Result<Option<Self>, StoreSetupError> {
        if ns.encryption != sluice_crypt::EncryptionPolicy::Aes256Gcm {
            return Ok(None);
        }
        let provider = keys.clone().ok_or_else(|| StoreSetupError::NoKeyDir { namespace: ns.name.clone() })?;
        Ok(Some(Self {
            provider,
            cipher: cipher.clone(),
            chunk_size: ns.encryption_chunk_bytes,
            previous_chunk_sizes: ns.encryption_previous_chunk_bytes.clone(),
        }))
    }
}

/// The configured chunk cipher. A DOCA engine must pass the known-answer
/// self-test before it sees data.
fn chunk_cipher(cfg: &EncryptionConfig) -> Result<Arc<dyn sluice_crypt::Cipher>, StoreSetupError> {
    match cfg.engine {
        CipherEngine::Ring => Ok(Arc::new(sluice_crypt::RingCipher)),
        CipherEngine::Doca => doca_cipher(cfg),
    }
}

#[cfg(feature = "doca")]
fn doca_cipher(cfg: &EncryptionConfig) -> Result<Arc<dyn sluice_crypt::Cipher>, StoreSetupError> {
    let fail = StoreSetupError::DocaCipher;
    let device = cfg.doca_device.as_deref().ok_or_else(|| fail("doca_device is not set".into()))?;
    let lib = sluice_doca::load().map_err(|e| fail(e.to_string()))?;
    let dev = sluice_doca::Device::open(&lib, device).map_err(|e| fail(e.to_string()))?;
    let cipher = sluice_crypt::DocaCipher::new(&dev).map_err(|e| fail(e.to_string()))?;
    sluice_crypt::self_test(&cipher).map_err(|e| fail(e.to_string()))?;
    // The self-test's buffers are 1 MiB; chunks go up to the format's
    // maximum, so make sure the engine takes one of those too.
    let probe = || -> Result<(), sluice_crypt::CryptError> {
        use sluice_crypt::Cipher as _;
        let key = cipher.chunk_key(&[0x5a; sluice_crypt::KEY_LEN])?;
        let mut chunk = vec![0xa5u8; sluice_crypt::MAX_CHUNK_SIZE as usize];
        let nonce = [7u8; sluice_crypt::NONCE_LEN];
        let tag = key.seal_in_place(&nonce, b"probe", &mut chunk)?;
        key.open_in_place(&nonce, b"probe", &mut chunk, &tag)?;
        if chunk.iter().all(|&b| b == 0xa5) {
            Ok(())
        } else {
            Err(sluice_crypt::CryptError::Crypto("a maximum-size chunk did not round-trip"))
        }
    };
    probe().map_err(|e| fail(format!("maximum-size chunk ({} bytes): {e}", sluice_crypt::MAX_CHUNK_SIZE)))?;
    tracing::info!(device, "DOCA AES-GCM engine passed its self-test");
    Ok(Arc::new(cipher))
}

#[cfg(not(feature = "doca"))]
fn doca_cipher(_cfg: &EncryptionConfig) -> Result<Arc<dyn sluice_crypt::Cipher>, StoreSetupError> {
    Err(StoreSetupError::DocaCipher("this sluice-agent was built without the `doca` feature".into()))
}

/// The keys `cred` names now (secret and session token files read).
fn keys(cred: &crate::config::CredentialConfig) -> Result<Keys, crate::config::SecretError> {
    Ok(Keys {
        access_key: cred.access_key.clone(),
        secret_key: cred.load_secret()?,
        session_token: cred.load_session_token()?,
    })
}

/// The signing clients of every namespace, by the credentials they use:
/// what a SIGHUP rotates.
#[derive(Default)]
pub struct Signers(Vec<(String, String, Arc<HttpClient>)>);

impl Signers {
    /// Records that namespace `ns` signs with credentials `credentials`.
    pub fn add(&mut self, credentials: &str, ns: &str, client: Arc<HttpClient>) {
        self.0.push((credentials.to_owned(), ns.to_owned(), client));
    }

    /// Gives every namespace the keys `cfg` now names (secret files are
    /// read again). Transfers in flight carry on; their next request signs
    /// with the new keys. Returns what changed; a credential whose secret
    /// cannot be read keeps its old keys (and is reported).
    pub fn rotate(&self, cfg: &AgentConfig) -> Vec<Result<String, String>> {
        let mut out = Vec::new();
        for (name, ns, client) in &self.0 {
            // The namespace may name other credentials now: its signer was
            // made for these, and is not switched (say so: a revocation by
            // renaming would otherwise look done).
            let named = cfg
                .tenants
                .iter()
                .flat_map(|t| t.namespaces.iter().map(move |n| (t, n)))
                .find_map(|(t, n)| (format!("{}/{}", t.name, n.name) == *ns).then_some(&n.credentials));
            if let Some(now) = named.filter(|now| *now != name) {
                out.push(Err(format!(
                    "namespace {ns:?} now names credentials {now:?}: switching a namespace's credentials needs a \
                     restart; it still signs with {name:?}"
                )));
            }
            let Some(cred) = cfg.credentials.get(name) else {
                out.push(Err(format!("credentials {name:?} (namespace {ns:?}) are gone from the config; kept")));
                continue;
            };
            match keys(cred) {
                Ok(keys) if client.rotate(&keys) => {
                    let token = if keys.session_token.is_some() { " with a session token" } else { "" };
                    out.push(Ok(format!("namespace {ns:?} signs with {name:?} as {}{token} now", cred.access_key)));
                }
                Ok(_) => {}
                Err(e) => out.push(Err(format!("credentials {name:?}: {e}; kept the old keys"))),
            }
        }
        out
    }
}
