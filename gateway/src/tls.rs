//! HTTPS on the gateway's S3 listener (`[tls]`): with a certificate and
//! key it serves only HTTPS on `listen`, so object bytes and signed
//! requests diverted on the wire cannot be read; without them, plain HTTP
//! as before. The RDMA data path is unchanged: its tokens are headers.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;

/// `[tls]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// The certificate chain (PEM, leaf first) for the names clients dial.
    #[serde(default)]
    pub cert: Option<PathBuf>,
    /// Its private key (PEM); keep it 0600.
    #[serde(default)]
    pub key: Option<PathBuf>,
}

/// Why the certificate or key cannot be served (the gateway does not start).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    #[error("[tls] needs both cert and key (missing: {0})")]
    Incomplete(&'static str),
    #[error("[tls] {what} {path}: {source}")]
    Read { what: &'static str, path: PathBuf, source: std::io::Error },
    #[error("[tls] cert {path}: not valid PEM: {source}")]
    CertPem { path: PathBuf, source: rustls::pki_types::pem::Error },
    #[error("[tls] cert {path}: no certificate in it (expected PEM \"-----BEGIN CERTIFICATE-----\" blocks)")]
    NoCertificate { path: PathBuf },
    #[error("[tls] key {path}: no private key in it (PEM PKCS#8, PKCS#1 or SEC1): {source}")]
    Key { path: PathBuf, source: rustls::pki_types::pem::Error },
    #[error("[tls] cert {cert} and key {key} do not go together: {source}")]
    Mismatch { cert: PathBuf, key: PathBuf, source: rustls::Error },
}

impl TlsConfig {
    /// Whether the section asks for HTTPS.
    pub fn enabled(&self) -> bool {
        self.cert.is_some() || self.key.is_some()
    }

    /// Both files or neither.
    pub fn validate(&self) -> Result<(), TlsError> {
        match (&self.cert, &self.key) {
            (Some(_), None) => Err(TlsError::Incomplete("key")),
            (None, Some(_)) => Err(TlsError::Incomplete("cert")),
            _ => Ok(()),
        }
    }

    /// Makes relative paths relative to `base` (the config file's directory).
    pub fn resolve(&mut self, base: &Path) {
        for p in [&mut self.cert, &mut self.key].into_iter().flatten() {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        }
    }

    /// The acceptor for the S3 listener, when HTTPS is configured. HTTP/1.1
    /// by ALPN (the gateway serves HTTP/1 only).
    pub fn acceptor(&self) -> Result<Option<tokio_rustls::TlsAcceptor>, TlsError> {
        self.validate()?;
        let (Some(cert), Some(key)) = (&self.cert, &self.key) else { return Ok(None) };
        let read = |what, path: &PathBuf| {
            std::fs::read(path).map_err(|source| TlsError::Read { what, path: path.clone(), source })
        };
        let cert_pem = read("cert", cert)?;
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<Result<_, _>>()
            .map_err(|source| TlsError::CertPem { path: cert.clone(), source })?;
        if chain.is_empty() {
            return Err(TlsError::NoCertificate { path: cert.clone() });
        }
        let key_der = PrivateKeyDer::from_pem_slice(&read("key", key)?)
            .map_err(|source| TlsError::Key { path: key.clone(), source })?;
        // ring explicitly: the upstream backend links aws-lc-rs as well, and
        // rustls will not pick between two process-wide providers.
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mismatch = |source| TlsError::Mismatch { cert: cert.clone(), key: key.clone(), source };
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(mismatch)?
            .with_no_client_auth()
            // Checks that the key is the certificate's (keys_match).
            .with_single_cert(chain, key_der)
            .map_err(mismatch)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Some(tokio_rustls::TlsAcceptor::from(Arc::new(config))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert_and_key() -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap();
        (params.self_signed(&key).unwrap().pem(), key.serialize_pem())
    }

    /// The acceptor's error (the acceptor has no `Debug` for `unwrap_err`).
    fn refused(t: &TlsConfig) -> TlsError {
        t.acceptor().err().expect("refused")
    }

    fn config(dir: &Path, cert: &str, key: &str) -> TlsConfig {
        let (c, k) = (dir.join("c.pem"), dir.join("k.pem"));
        std::fs::write(&c, cert).unwrap();
        std::fs::write(&k, key).unwrap();
        TlsConfig { cert: Some(c), key: Some(k) }
    }

    #[test]
    fn bad_certificates_and_keys_are_clear_startup_errors() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = cert_and_key();
        assert!(config(dir.path(), &cert, &key).acceptor().unwrap().is_some());
        assert!(TlsConfig::default().acceptor().unwrap().is_none(), "no [tls]: plain HTTP");

        let half = TlsConfig { cert: Some("c.pem".into()), key: None };
        assert!(refused(&half).to_string().contains("missing: key"));

        let absent = TlsConfig { cert: Some(dir.path().join("none.pem")), key: Some(dir.path().join("k.pem")) };
        let e = refused(&absent).to_string();
        assert!(e.contains("cert") && e.contains("none.pem"), "{e}");

        let e = refused(&config(dir.path(), "garbage\n", &key));
        assert!(matches!(e, TlsError::NoCertificate { .. }), "{e}");

        let e = refused(&config(dir.path(), &cert, "garbage\n"));
        assert!(matches!(e, TlsError::Key { .. }), "{e}");

        // Another certificate's key.
        let (_, other_key) = cert_and_key();
        let e = refused(&config(dir.path(), &cert, &other_key));
        assert!(matches!(e, TlsError::Mismatch { .. }) && e.to_string().contains("do not go together"), "{e}");
    }

    /// With `[tls]` the listener speaks HTTPS only: a client trusting the
    /// certificate gets S3 answers (here: an unsigned request refused), a
    /// plaintext request gets no HTTP answer at all.
    #[tokio::test]
    async fn the_gateway_serves_https_only() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = cert_and_key();
        let tls = config(dir.path(), &cert, &key);
        let cfg: crate::GatewayConfig = toml::from_str(&format!(
            "listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\nbuckets = [\"bkt\"]\n[tls]\ncert = \"{}\"\nkey = \"{}\"\n\
             [[credentials]]\naccess_key = \"a\"\nsecret_key = \"b\"\n",
            dir.path().join("data").display(),
            tls.cert.unwrap().display(),
            tls.key.unwrap().display()
        ))
        .unwrap();
        let gw = crate::Gateway::bind(&cfg).await.unwrap();
        let addr = gw.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = tokio::spawn(gw.serve(async move {
            let _ = stopped.await;
        }));
        let request = b"GET /bkt/k HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n";

        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(cert.as_bytes()) {
            roots.add(c.unwrap()).unwrap();
        }
        let client = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let mut https = tokio_rustls::TlsConnector::from(Arc::new(client)).connect(name, tcp).await.unwrap();
        https.write_all(request).await.unwrap();
        let mut answer = String::new();
        https.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");

        let mut plain = tokio::net::TcpStream::connect(addr).await.unwrap();
        plain.write_all(request).await.unwrap();
        let mut answer = Vec::new();
        let _ = plain.read_to_end(&mut answer).await;
        assert!(!answer.starts_with(b"HTTP/"), "plain HTTP got an HTTP answer: {}", String::from_utf8_lossy(&answer));

        let _ = stop.send(());
        serving.await.unwrap();
    }

    #[test]
    fn the_example_section_parses_uncommented() {
        let example = include_str!("../../deploy/gateway.example.toml");
        let section: String = example
            .lines()
            .skip_while(|l| !l.starts_with("# [tls]"))
            .take_while(|l| l.starts_with('#'))
            .map(|l| format!("{}\n", l.trim_start_matches("# ")))
            .collect();
        let t: std::collections::HashMap<String, TlsConfig> = toml::from_str(&section).unwrap();
        let t = &t["tls"];
        assert_eq!(t.cert.as_deref(), Some(Path::new("/etc/sluice/tls/gateway.crt")));
        assert_eq!(t.key.as_deref(), Some(Path::new("/etc/sluice/tls/gateway.key")));
    }

    #[test]
    fn relative_paths_follow_the_config_file() {
        let mut t = TlsConfig { cert: Some("tls/gateway.crt".into()), key: Some("/abs/gateway.key".into()) };
        t.resolve(Path::new("/etc/sluice"));
        assert_eq!(t.cert.unwrap(), Path::new("/etc/sluice/tls/gateway.crt"));
        assert_eq!(t.key.unwrap(), Path::new("/abs/gateway.key"));
    }
}
