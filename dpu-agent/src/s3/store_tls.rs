//! HTTPS to the stores. A namespace's `https://` endpoints are verified
//! against the built-in Mozilla roots, the system's trust store (or the
//! files `SSL_CERT_FILE` / `SSL_CERT_DIR` name, when set) and, for a store
//! with a private CA, the namespace's `ca_file`. Namespaces naming the same
//! `ca_file` (or none) share one connection pool. Also the startup warning
//! for stores reached in clear by an agent that serves several tenants.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

use super::error::S3Error;
use crate::config::{AgentConfig, NamespaceConfig, S3Tuning};

/// Why a namespace's `ca_file` cannot be used (the agent does not start).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CaFileError {
    #[error("ca_file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("ca_file {path}: not valid PEM: {source}")]
    Pem { path: PathBuf, source: rustls::pki_types::pem::Error },
    #[error("ca_file {path}: no certificate in it (expected PEM \"-----BEGIN CERTIFICATE-----\" blocks)")]
    Empty { path: PathBuf },
    #[error("ca_file {path}: certificate {index} cannot be a trust anchor: {source}")]
    Certificate { path: PathBuf, index: usize, source: rustls::Error },
    #[error("ca_file {path} is set, but none of the endpoints is https://")]
    NoHttpsEndpoint { path: PathBuf },
    #[error("ca_file {path} was not loaded at start")]
    NotLoaded { path: PathBuf },
    #[error("building its HTTPS client: {0}")]
    Client(#[source] S3Error),
}

/// Why the agent's connection pools cannot be built (it does not start).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PoolsError {
    #[error("building the HTTP client: {0}")]
    HttpClient(#[source] S3Error),
    #[error("namespace {namespace:?}: {source}")]
    CaFile { namespace: String, source: CaFileError },
}

/// The CA certificates in a PEM file (one or several), each checked to be
/// usable as a trust anchor.
pub fn load_ca_file(path: &Path) -> Result<Vec<CertificateDer<'static>>, CaFileError> {
    let pem = std::fs::read(path).map_err(|source| CaFileError::Read { path: path.to_owned(), source })?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|source| CaFileError::Pem { path: path.to_owned(), source })?;
    if certs.is_empty() {
        return Err(CaFileError::Empty { path: path.to_owned() });
    }
    // The same check rustls makes when the pool is built, here with the
    // file and the certificate's place in it.
    let mut roots = rustls::RootCertStore::empty();
    for (i, c) in certs.iter().enumerate() {
        roots.add(c.clone()).map_err(|source| CaFileError::Certificate {
            path: path.to_owned(),
            index: i + 1,
            source,
        })?;
    }
    Ok(certs)
}

/// The agent's HTTP connection pools: one for the namespaces without a
/// `ca_file`, one per distinct `ca_file`.
pub struct Pools {
    base: reqwest::Client,
    by_ca: BTreeMap<PathBuf, reqwest::Client>,
    /// Connections for data GETs to `http://` endpoints; `None` with
    /// `[s3] direct_gets = false`.
    direct: Option<Arc<super::http1::Http1>>,
}

impl Pools {
    /// The pools the namespaces of `cfg` need. Errors name the namespace.
    pub fn from_config(cfg: &AgentConfig) -> Result<Self, PoolsError> {
        let fail = |ns: &NamespaceConfig, source| PoolsError::CaFile { namespace: ns.name.clone(), source };
        let base = super::http_client::pool(&cfg.s3, &[]).map_err(PoolsError::HttpClient)?;
        let mut by_ca = BTreeMap::new();
        for ns in cfg.tenants.iter().flat_map(|t| &t.namespaces) {
            let Some(path) = &ns.ca_file else { continue };
            if !ns.endpoints.iter().any(|e| e.starts_with("https://")) {
                return Err(fail(ns, CaFileError::NoHttpsEndpoint { path: path.clone() }));
            }
            if by_ca.contains_key(path) {
                continue;
            }
            let pool = load_ca_file(path).and_then(|roots| pool_with(&cfg.s3, &roots)).map_err(|e| fail(ns, e))?;
            tracing::info!(namespace = %ns.name, ca_file = %path.display(), "trusting a private CA for the store");
            by_ca.insert(path.clone(), pool);
        }
        let direct = cfg.s3.direct_gets.then(|| {
            super::http1::Http1::new(
                Duration::from_millis(cfg.s3.connect_timeout_ms),
                Duration::from_millis(cfg.s3.read_timeout_ms),
            )
        });
        Ok(Self { base, by_ca, direct })
    }

    /// Where data GETs to `http://` endpoints go (`None`: the pools).
    pub fn direct(&self) -> Option<Arc<super::http1::Http1>> {
        self.direct.clone()
    }

    /// The pool for namespace `ns` (of the config these pools were built
    /// from: any other `ca_file` is an error, never the base pool).
    pub fn for_namespace(&self, ns: &NamespaceConfig) -> Result<reqwest::Client, CaFileError> {
        match &ns.ca_file {
            None => Ok(self.base.clone()),
            Some(path) => self.by_ca.get(path).cloned().ok_or_else(|| CaFileError::NotLoaded { path: path.clone() }),
        }
    }
}

fn pool_with(tuning: &S3Tuning, roots: &[CertificateDer<'static>]) -> Result<reqwest::Client, CaFileError> {
    super::http_client::pool(tuning, roots).map_err(CaFileError::Client)
}

/// Whether `endpoint` talks plain HTTP to another machine.
fn plaintext_off_host(endpoint: &str) -> bool {
    let Ok(url) = reqwest::Url::parse(endpoint) else { return false };
    if url.scheme() != "http" {
        return false;
    }
    let Some(host) = url.host_str() else { return true };
    match host.trim_start_matches('[').trim_end_matches(']').parse::<std::net::IpAddr>() {
        Ok(ip) => !ip.is_loopback(),
        Err(_) => {
            let name = host.trim_end_matches('.').to_ascii_lowercase();
            name != "localhost" && !name.ends_with(".localhost")
        }
    }
}

/// `(tenant, namespace, endpoint)` for every endpoint an agent serving
/// several tenants (or isolating them at the NIC) reaches in clear over
/// the network. Empty for a single-tenant agent: its one tenant owns the
/// link as much as the agent does.
pub fn plaintext_stores(cfg: &AgentConfig) -> Vec<(&str, &str, &str)> {
    if cfg.tenants.len() < 2 && cfg.nic.is_none() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for t in &cfg.tenants {
        for ns in &t.namespaces {
            for e in ns.endpoints.iter().filter(|e| plaintext_off_host(e)) {
                out.push((t.name.as_str(), ns.name.as_str(), e.as_str()));
            }
        }
    }
    out
}

/// Logs a warning for each of [`plaintext_stores`].
pub fn warn_plaintext_stores(cfg: &AgentConfig) {
    for (tenant, namespace, endpoint) in plaintext_stores(cfg) {
        tracing::warn!(
            tenant,
            namespace,
            endpoint,
            "this namespace's object bytes and signed requests cross the network in clear: anyone on the path \
             can read them. Serve the store over HTTPS and use an https:// endpoint (with ca_file = the CA's \
             PEM for a private CA; `sluice certs --gateway-name` issues one for sluice-gateway)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = include_str!("../../../deploy/agent.example.toml");

    fn ca_pem() -> (rcgen::Issuer<'static, rcgen::KeyPair>, String) {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, "test store CA");
        let key = rcgen::KeyPair::generate().unwrap();
        let pem = params.self_signed(&key).unwrap().pem();
        (rcgen::Issuer::new(params, key), pem)
    }

    #[test]
    fn ca_files_are_checked_with_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let p = |n: &str| dir.path().join(n);

        let e = load_ca_file(&p("absent.pem")).unwrap_err();
        assert!(matches!(e, CaFileError::Read { .. }) && e.to_string().contains("absent.pem"), "{e}");

        std::fs::write(p("garbage.pem"), "this is not a certificate\n").unwrap();
        let e = load_ca_file(&p("garbage.pem")).unwrap_err();
        assert!(matches!(e, CaFileError::Empty { .. }) && e.to_string().contains("BEGIN CERTIFICATE"), "{e}");

        std::fs::write(p("bad-base64.pem"), "-----BEGIN CERTIFICATE-----\n@@@@\n-----END CERTIFICATE-----\n").unwrap();
        let e = load_ca_file(&p("bad-base64.pem")).unwrap_err();
        assert!(matches!(e, CaFileError::Pem { .. }), "{e}");

        // Well-formed PEM around bytes that are no certificate.
        std::fs::write(p("not-x509.pem"), "-----BEGIN CERTIFICATE-----\naGVsbG8gd29ybGQ=\n-----END CERTIFICATE-----\n")
            .unwrap();
        let e = load_ca_file(&p("not-x509.pem")).unwrap_err();
        assert!(matches!(e, CaFileError::Certificate { index: 1, .. }), "{e}");

        // A bundle: every certificate in it is trusted.
        let (_, one) = ca_pem();
        let (_, two) = ca_pem();
        std::fs::write(p("bundle.pem"), format!("{one}{two}")).unwrap();
        assert_eq!(load_ca_file(&p("bundle.pem")).unwrap().len(), 2);
    }

    /// A one-shot HTTPS server on 127.0.0.1 with a certificate from `ca`;
    /// answers one request with 200 "ok".
    async fn https_server(ca: &rcgen::Issuer<'static, rcgen::KeyPair>) -> std::net::SocketAddr {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, ca).unwrap();
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
            )
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (tcp, _) = listener.accept().await.unwrap();
                let Ok(mut tls) = acceptor.accept(tcp).await else { continue };
                let mut buf = [0u8; 4096];
                let _ = tls.read(&mut buf).await;
                let _ = tls.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok").await;
                let _ = tls.shutdown().await;
            }
        });
        addr
    }

    /// The agent's client reaches a store with a private CA given that CA,
    /// and without it fails at once with an error that names the
    /// certificate and the fix.
    #[tokio::test]
    async fn a_private_ca_is_trusted_only_when_configured() {
        crate::tls::install_crypto_provider();
        let (ca, ca_pem) = ca_pem();
        let addr = https_server(&ca).await;
        let dir = tempfile::tempdir().unwrap();
        let ca_file = dir.path().join("ca.pem");
        std::fs::write(&ca_file, ca_pem).unwrap();
        let url = format!("https://{addr}/");
        let trusting = super::super::http_client::pool(&S3Tuning::default(), &load_ca_file(&ca_file).unwrap()).unwrap();
        let resp = trusting.get(&url).send().await.unwrap();
        assert_eq!(resp.text().await.unwrap(), "ok");

        let plain = super::super::http_client::pool(&S3Tuning::default(), &[]).unwrap();
        let t0 = std::time::Instant::now();
        let e = crate::s3::error::S3Error::from_reqwest(plain.get(&url).send().await.unwrap_err());
        assert!(t0.elapsed() < std::time::Duration::from_secs(2), "a refused certificate fails at once");
        assert!(!e.is_retryable(), "{e}");
        let msg = e.to_string();
        assert!(matches!(e, crate::s3::error::S3Error::Tls(_)), "{msg}");
        assert!(msg.contains("certificate") && msg.contains("ca_file"), "{msg}");

        // A trusted certificate for another name: the error says that instead.
        let other_name = format!("https://localhost:{}/", addr.port());
        let e = crate::s3::error::S3Error::from_reqwest(trusting.get(&other_name).send().await.unwrap_err());
        let msg = e.to_string();
        assert!(
            matches!(e, crate::s3::error::S3Error::Tls(_)) && msg.contains("does not name the endpoint's host"),
            "{msg}"
        );
    }

    fn example() -> AgentConfig {
        let cfg: AgentConfig = toml::from_str(EXAMPLE).unwrap();
        cfg.validate().unwrap();
        cfg
    }

    #[test]
    fn a_bad_ca_file_stops_the_agent_naming_the_namespace() {
        let mut cfg = example();
        let ns = &mut cfg.tenants[0].namespaces[0];
        ns.endpoints = vec!["https://store.example:9000".into()];
        ns.ca_file = Some("/nonexistent/ca.pem".into());
        let name = ns.name.clone();
        let e = Pools::from_config(&cfg).err().unwrap().to_string();
        assert!(e.contains(&name) && e.contains("/nonexistent/ca.pem"), "{e}");

        // A CA for plain http:// endpoints protects nothing: refused.
        let ns = &mut cfg.tenants[0].namespaces[0];
        ns.endpoints = vec!["http://store.example:9000".into()];
        let e = Pools::from_config(&cfg).err().unwrap().to_string();
        assert!(e.contains("none of the endpoints is https://"), "{e}");
    }

    #[test]
    fn the_example_ca_file_setting_parses_and_resolves() {
        // The commented ca_file example, uncommented, is a valid namespace setting.
        let line = EXAMPLE.lines().find_map(|l| l.strip_prefix("# ca_file = ")).expect("a ca_file example");
        let mut cfg = example();
        let ns: NamespaceConfig = toml::from_str(&format!(
            "name = \"s\"\nendpoints = [\"https://s3.internal:9000\"]\nbucket = \"b\"\ncredentials = \"c\"\nca_file = {line}\n"
        ))
        .unwrap();
        let mut relative = ns.clone();
        relative.ca_file = Some("tls/ca.crt".into());
        cfg.tenants[0].namespaces.extend([ns, relative]);
        crate::config::resolve_ca_files(&mut cfg, Path::new("/etc/sluice"));
        let ca: Vec<PathBuf> = cfg.tenants[0].namespaces.iter().filter_map(|n| n.ca_file.clone()).collect();
        assert_eq!(ca, [Path::new("/etc/sluice/tls/ca.crt"), Path::new("/etc/sluice/tls/ca.crt")]);
    }

    #[test]
    fn plaintext_off_host_endpoints_are_found_in_a_shared_agent() {
        for (e, clear) in [
            ("http://10.0.0.5:9000", true),
            ("http://store.internal", true),
            ("http://[fd00::5]:9000", true),
            ("https://10.0.0.5:9000", false),
            ("http://127.0.0.1:9000", false),
            ("http://127.3.4.5:9000", false),
            ("http://[::1]:9000", false),
            ("http://localhost:9000", false),
            ("http://LOCALHOST.:9000", false),
        ] {
            assert_eq!(plaintext_off_host(e), clear, "{e}");
        }
        let mut cfg = example();
        cfg.tenants.truncate(1);
        cfg.tenants[0].name = "alpha".into();
        cfg.tenants[0].namespaces[0].endpoints = vec!["http://10.0.0.5:9000".into(), "https://10.0.0.6".into()];
        assert!(plaintext_stores(&cfg).is_empty(), "one tenant, no [nic]: no warning");
        let mut second = cfg.tenants[0].clone();
        second.name = "beta".into();
        cfg.tenants.push(second);
        let found = plaintext_stores(&cfg);
        let ns = cfg.tenants[0].namespaces[0].name.as_str();
        assert_eq!(found, vec![("alpha", ns, "http://10.0.0.5:9000"), ("beta", ns, "http://10.0.0.5:9000")]);
    }
}
