//! TLS on the agent's TCP control channel: the agent presents a server
//! certificate, every shim a client certificate signed by `client_ca`
//! (mutual TLS), on top of the tenant secret's session proofs. A shim's
//! certificate names (its common name and DNS names) must include one of
//! its tenant's `tls_client_names`, so one tenant's certificate cannot open
//! another tenant's sessions. `sluice certs` issues a private CA and the
//! certificates. The Unix socket stays plaintext: it is local, and only the
//! shim's user reaches it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use std::time::Duration;

use serde::Deserialize;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;

/// Makes ring the process's TLS crypto provider. Call once at start, before
/// any TLS is set up: two providers are linked in, and rustls refuses to
/// guess between them.
pub fn install_crypto_provider() {
    // An error means one is installed already, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// `[tls]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// The agent's certificate chain (PEM), for the names shims dial.
    #[serde(default)]
    pub cert: Option<PathBuf>,
    /// Its private key (PEM); keep it 0600.
    #[serde(default)]
    pub key: Option<PathBuf>,
    /// The CA (PEM) that signs shims' client certificates.
    #[serde(default)]
    pub client_ca: Option<PathBuf>,
    /// Plaintext gRPC on TCP: only for a trusted, private link. Logged as a
    /// warning at every start.
    #[serde(default)]
    pub insecure: bool,
}

/// An invalid `[tls]` section.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsConfigError {
    #[error("[tls] sets certificates and insecure = true: choose one")]
    CertificatesAndInsecure,
    #[error("[tls] needs cert, key and client_ca (mutual TLS); missing: {missing}")]
    Missing { missing: String },
    #[error(
        "the agent listens on TCP (grpc_listen or a tenant listener): set [tls] cert, key and client_ca \
         (`sluice certs` issues them), or [tls] insecure = true for plaintext on a trusted link"
    )]
    Plaintext,
}

/// Why the listeners' TLS cannot be set up from `[tls]`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// `what` (certificate, key, client_ca) at `path` could not be used.
    #[error("{what} {}: {message}", path.display())]
    Load { what: &'static str, path: PathBuf, message: String },
}

impl TlsConfig {
    /// Whether certificates are configured.
    pub fn enabled(&self) -> bool {
        self.cert.is_some() || self.key.is_some() || self.client_ca.is_some()
    }

    /// Checks the section for an agent that does (`tcp`) or does not listen
    /// on TCP.
    pub fn validate(&self, tcp: bool) -> Result<(), TlsConfigError> {
        let missing: Vec<&str> = [("cert", &self.cert), ("key", &self.key), ("client_ca", &self.client_ca)]
            .into_iter()
            .filter_map(|(n, v)| v.is_none().then_some(n))
            .collect();
        match (self.enabled(), self.insecure) {
            (true, true) => Err(TlsConfigError::CertificatesAndInsecure),
            (true, false) if !missing.is_empty() => Err(TlsConfigError::Missing { missing: missing.join(", ") }),
            (false, false) if tcp => Err(TlsConfigError::Plaintext),
            _ => Ok(()),
        }
    }

    /// Makes relative paths relative to `base` (the config file's directory).
    pub fn resolve(&mut self, base: &Path) {
        for p in [&mut self.cert, &mut self.key, &mut self.client_ca].into_iter().flatten() {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        }
    }

    /// The TLS acceptor for the TCP listeners, when certificates are
    /// configured: our certificate, client certificates required and
    /// checked against `client_ca`, HTTP/2 or framed GETs by ALPN.
    pub fn acceptor(&self) -> Result<Option<tokio_rustls::TlsAcceptor>, TlsError> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let (Some(cert), Some(key), Some(ca)) = (&self.cert, &self.key, &self.client_ca) else {
            return Ok(None);
        };
        let fail = |what: &'static str, p: &Path, e: &dyn std::fmt::Display| TlsError::Load {
            what,
            path: p.to_owned(),
            message: e.to_string(),
        };
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
            .and_then(|i| i.collect::<Result<_, _>>())
            .map_err(|e| fail("certificate", cert, &e))?;
        let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| fail("key", key, &e))?;
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(ca).map_err(|e| fail("client_ca", ca, &e))? {
            roots.add(c.map_err(|e| fail("client_ca", ca, &e))?).map_err(|e| fail("client_ca", ca, &e))?;
        }
        let verifier = rustls::server::WebPkiClientVerifier::builder(Arc::new(roots))
            .build()
            .map_err(|e| fail("client_ca", ca, &e))?;
        let mut config = rustls::ServerConfig::builder()
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key_der)
            .map_err(|e| fail("certificate and key", cert, &e))?;
        // Framed GETs first: a shim that asks for them offers both, and
        // rustls takes the first of ours the client offered.
        config.alpn_protocols = vec![sluice_proto::framed_gets::ALPN.to_vec(), b"h2".to_vec()];
        Ok(Some(tokio_rustls::TlsAcceptor::from(Arc::new(config))))
    }
}

/// Longest a TLS handshake may take before the connection is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in progress per listener: a flood of half-open connections
/// waits for these instead of taking descriptors and memory without bound.
const MAX_HANDSHAKES: usize = 128;

/// Connections on `listener` that completed the TLS handshake. A refused
/// handshake (unknown CA, expired certificate, a plaintext client) is
/// logged with its reason and reported to `refused`; it never reaches gRPC.
pub fn incoming(
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    refused: impl Fn() + Send + Sync + 'static,
) -> impl futures::Stream<Item = std::io::Result<TlsStream<TcpStream>>> {
    handshakes(tokio_stream::wrappers::TcpListenerStream::new(listener), acceptor, refused)
}

/// Like [`incoming`], for connections accepted elsewhere (a per-core
/// runtime gets its share of a listener's connections this way, and runs
/// their handshakes itself). An `Err` item (a failed accept) pauses the
/// stream briefly instead of spinning.
pub fn handshakes(
    conns: impl futures::Stream<Item = std::io::Result<TcpStream>> + Send + 'static,
    acceptor: tokio_rustls::TlsAcceptor,
    refused: impl Fn() + Send + Sync + 'static,
) -> impl futures::Stream<Item = std::io::Result<TlsStream<TcpStream>>> {
    let (tx, rx) = tokio::sync::mpsc::channel(MAX_HANDSHAKES);
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
    let refused = Arc::new(refused);
    tokio::spawn(async move {
        let mut conns = std::pin::pin!(conns);
        loop {
            let Some(tcp) = crate::accept::next_conn(&mut conns, tx.closed(), "a control connection").await else {
                return;
            };
            let peer = tcp.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "a closed peer".into());
            let Ok(slot) = slots.clone().acquire_owned().await else { return };
            let _ = tcp.set_nodelay(true);
            let (acceptor, tx, refused) = (acceptor.clone(), tx.clone(), refused.clone());
            tokio::spawn(async move {
                let _slot = slot;
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => {
                        let _ = tx.send(Ok(tls)).await;
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(%peer, error = %e, "TLS handshake refused");
                        refused();
                    }
                    Err(_) => {
                        tracing::warn!(%peer, "TLS handshake timed out");
                        refused();
                    }
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// What a shim's client certificate says about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCert {
    /// Common name and DNS names.
    pub names: Vec<String>,
    /// SHA-256 of the certificate (sessions are bound to it).
    pub fingerprint: String,
}

impl ClientCert {
    /// Reads the leaf certificate of a verified chain. One that does not
    /// parse names nothing (and so is accepted for no tenant).
    pub fn from_der(der: &[u8]) -> Arc<Self> {
        use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};
        let mut names = Vec::new();
        if let Ok((_, cert)) = X509Certificate::from_der(der) {
            names.extend(cert.subject().iter_common_name().filter_map(|cn| cn.as_str().ok().map(str::to_owned)));
            if let Ok(Some(san)) = cert.subject_alternative_name() {
                for n in &san.value.general_names {
                    if let GeneralName::DNSName(d) = n {
                        if !names.iter().any(|x| x == d) {
                            names.push((*d).to_owned());
                        }
                    }
                }
            }
        }
        let fingerprint = hex::encode(ring::digest::digest(&ring::digest::SHA256, der));
        Arc::new(Self { names, fingerprint })
    }

    /// Whether it names one of `allowed`.
    pub fn names_any(&self, allowed: &[String]) -> bool {
        self.names.iter().any(|n| allowed.contains(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_section_is_all_or_insecure() {
        let path = Some(PathBuf::from("x"));
        let full = TlsConfig { cert: path.clone(), key: path.clone(), client_ca: path.clone(), insecure: false };
        assert!(full.validate(true).is_ok());
        assert!(TlsConfig { insecure: true, ..Default::default() }.validate(true).is_ok());
        assert!(TlsConfig::default().validate(false).is_ok(), "Unix socket only: nothing to secure");
        let e = TlsConfig::default().validate(true).unwrap_err().to_string();
        assert!(e.contains("insecure = true") && e.contains("sluice certs"), "{e}");
        let e = TlsConfig { client_ca: None, ..full.clone() }.validate(true).unwrap_err().to_string();
        assert!(e.contains("missing: client_ca"), "{e}");
        let e = TlsConfig { insecure: true, ..full }.validate(true).unwrap_err().to_string();
        assert!(e.contains("choose one"), "{e}");
    }

    #[test]
    fn names_come_from_the_common_name_and_dns_names() {
        let mut params = rcgen::CertificateParams::new(vec!["node-7.example".to_owned()]).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, "alpha");
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let c = ClientCert::from_der(cert.der());
        assert_eq!(c.names, ["alpha", "node-7.example"]);
        assert!(c.names_any(&["alpha".into()]));
        assert!(!c.names_any(&["beta".into()]));
        assert_eq!(c.fingerprint.len(), 64);
        assert!(!ClientCert::from_der(b"not a certificate").names_any(&["alpha".into(), String::new()]));
    }
}
