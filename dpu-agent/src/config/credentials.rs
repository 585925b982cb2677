//! `[credentials.<name>]`: the S3 keys namespaces sign with, and reading
//! their secrets (inline or from files, again on every SIGHUP). Nothing
//! here is ever sent to the host.

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// An invalid `[credentials.<name>]` section.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CredentialConfigError {
    #[error("credentials {name:?}: set exactly one of secret_key and secret_key_file")]
    SecretKey { name: String },
    #[error("credentials {name:?}: set at most one of session_token and session_token_file")]
    SessionToken { name: String },
}

/// Why a credential's secret or session token cannot be had now.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SecretError {
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    // The "invalid config" prefixes are what these said when config
    // validation reported them; operators and scripts match them.
    #[error("invalid config: credential without a secret")]
    NoSecret,
    #[error("invalid config: the session token of access key {access_key} is empty or not printable ASCII")]
    BadSessionToken { access_key: String },
    #[error("{path} has mode {mode:o}: a credentials file must not be readable by group or others (chmod 600)")]
    Mode { path: PathBuf, mode: u32 },
    #[error("{path} is empty")]
    Empty { path: PathBuf },
}

/// A credentials file's contents, trimmed: only from a file no one but its
/// owner may read (as the shims' secrets must be), and never empty.
fn read_private(path: &std::path::Path) -> Result<String, SecretError> {
    use std::os::unix::fs::PermissionsExt;
    let read = |source| SecretError::Read { path: path.to_owned(), source };
    let mode = std::fs::metadata(path).map_err(read)?.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(SecretError::Mode { path: path.to_owned(), mode });
    }
    let text = std::fs::read_to_string(path).map_err(read)?.trim().to_owned();
    if text.is_empty() {
        return Err(SecretError::Empty { path: path.to_owned() });
    }
    Ok(text)
}

/// An S3 access key; the secret comes inline or from a file (preferred).
/// Temporary credentials (STS) add their session token, also inline or
/// from a file; all of them are read again on SIGHUP.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialConfig {
    pub access_key: String,
    #[serde(default)]
    pub secret_key: Option<String>,
    #[serde(default)]
    pub secret_key_file: Option<PathBuf>,
    #[serde(default)]
    pub session_token: Option<String>,
    #[serde(default)]
    pub session_token_file: Option<PathBuf>,
}

impl std::fmt::Debug for CredentialConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CredentialConfig")
            .field("access_key", &self.access_key)
            .field("secret_key", &self.secret_key.as_ref().map(|_| "<redacted>"))
            .field("secret_key_file", &self.secret_key_file)
            .field("session_token", &self.session_token.as_ref().map(|_| "<redacted>"))
            .field("session_token_file", &self.session_token_file)
            .finish()
    }
}

impl CredentialConfig {
    /// The secret, read from its file if configured that way.
    pub fn load_secret(&self) -> Result<String, SecretError> {
        match (&self.secret_key, &self.secret_key_file) {
            (Some(s), _) => Ok(s.clone()),
            (None, Some(path)) => read_private(path),
            (None, None) => Err(SecretError::NoSecret),
        }
    }

    /// The session token of temporary credentials, read from its file if
    /// configured that way; `None` for long-term keys.
    pub fn load_session_token(&self) -> Result<Option<String>, SecretError> {
        let token = match (&self.session_token, &self.session_token_file) {
            (Some(t), _) => t.trim().to_owned(),
            (None, Some(path)) => read_private(path)?,
            (None, None) => return Ok(None),
        };
        // It travels as a header value: visible ASCII, as STS issues them.
        if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(SecretError::BadSessionToken { access_key: self.access_key.clone() });
        }
        Ok(Some(token))
    }

    /// Checks that `[credentials.<name>]` says where its secret comes from
    /// exactly once, and its session token at most once.
    pub fn validate(&self, name: &str) -> Result<(), CredentialConfigError> {
        if self.secret_key.is_some() == self.secret_key_file.is_some() {
            return Err(CredentialConfigError::SecretKey { name: name.to_owned() });
        }
        if self.session_token.is_some() && self.session_token_file.is_some() {
            return Err(CredentialConfigError::SessionToken { name: name.to_owned() });
        }
        Ok(())
    }

    /// Makes relative secret files relative to `base` (the config file's
    /// directory).
    pub fn resolve(&mut self, base: &Path) {
        for f in [&mut self.secret_key_file, &mut self.session_token_file].into_iter().flatten() {
            if f.is_relative() {
                *f = base.join(&*f);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Secret and token files are read only if no one but their owner may
    /// read them, and never as an empty secret.
    #[test]
    fn credential_files_must_be_private_and_not_empty() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let file = |name: &str, data: &str, mode: u32| {
            let p = d.path().join(name);
            std::fs::write(&p, data).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            p
        };
        let c = |secret: std::path::PathBuf, token: Option<std::path::PathBuf>| CredentialConfig {
            access_key: "AK".into(),
            secret_key: None,
            secret_key_file: Some(secret),
            session_token: None,
            session_token_file: token,
        };
        let good = file("good", "S3CR3T\n", 0o600);
        assert_eq!(c(good.clone(), None).load_secret().unwrap(), "S3CR3T");
        let shared = file("shared", "S3CR3T", 0o644);
        let e = c(shared, None).load_secret().unwrap_err();
        assert!(matches!(e, SecretError::Mode { mode: 0o644, .. }), "{e}");
        assert!(e.to_string().contains("chmod 600"), "{e}");
        let empty = file("empty", " \n", 0o600);
        assert!(matches!(c(empty, None).load_secret(), Err(SecretError::Empty { .. })));
        let token = file("token", "TOKEN", 0o640);
        assert!(matches!(c(good, Some(token)).load_session_token(), Err(SecretError::Mode { mode: 0o640, .. })));
    }

    #[test]
    fn debug_redacts_secret() {
        let c = CredentialConfig {
            access_key: "AK".into(),
            secret_key: Some("S3CR3T".into()),
            secret_key_file: None,
            session_token: Some("T0K3N".into()),
            session_token_file: None,
        };
        assert_eq!(c.load_session_token().unwrap().as_deref(), Some("T0K3N"));
        let bad = CredentialConfig { session_token: Some("a b\n".into()), ..c.clone() };
        assert!(bad.load_session_token().unwrap_err().to_string().contains("printable ASCII"));
        let shown = format!("{c:?}");
        assert!(!shown.contains("S3CR3T") && !shown.contains("T0K3N"), "{shown}");
    }
}
