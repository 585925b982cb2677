//! How a shim proves, per tenant, that the agent may trust it: a shared
//! secret per tenant (files of mode 0600 on both sides) and an HMAC over
//! the session request. Chosen over mutual TLS because on a BlueField the
//! control channel is bound to a host PCIe function (the agent checks that
//! binding separately) and a per-tenant secret is what rotates with the
//! tenant; TLS would add a CA per host without adding a tenant binding.

use std::path::{Path, PathBuf};

use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};

// v2 added the agent epoch: a v1 proof never verifies as a v2 one.
const CONTEXT: &[u8] = b"sluice-open-session-v2";
/// Shortest accepted secret.
pub const MIN_SECRET_BYTES: usize = 16;
/// Size of the per-request nonce.
pub const NONCE_BYTES: usize = 16;
/// Size of an agent epoch (random, new at every agent start).
pub const EPOCH_BYTES: usize = 16;

/// Reading a secret file failed or the file is unsafe.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SecretFileError {
    #[error("reading secret file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("secret file {path} has mode {mode:o}: it must not be readable by group or others (chmod 600)")]
    Mode { path: PathBuf, mode: u32 },
    #[error("secret file {path} holds {len} bytes; at least {MIN_SECRET_BYTES} are needed")]
    TooShort { path: PathBuf, len: usize },
}

/// Reads a secret (surrounding whitespace trimmed) from a file that only
/// its owner may read.
pub fn read_secret_file(path: &Path) -> Result<Vec<u8>, SecretFileError> {
    use std::os::unix::fs::PermissionsExt;
    let read = |source| SecretFileError::Read { path: path.to_owned(), source };
    let mode = std::fs::metadata(path).map_err(read)?.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(SecretFileError::Mode { path: path.to_owned(), mode });
    }
    let raw = std::fs::read(path).map_err(read)?;
    let secret = raw.trim_ascii().to_vec();
    if secret.len() < MIN_SECRET_BYTES {
        return Err(SecretFileError::TooShort { path: path.to_owned(), len: secret.len() });
    }
    Ok(secret)
}

/// What a session proof covers. The agent's epoch ties a proof to one run
/// of the agent: its nonce cache lives in memory, so without the epoch a
/// proof captured before an agent restart would pass again after it (within
/// the timestamp window).
#[derive(Debug, Clone, Copy)]
pub struct SessionClaim<'a> {
    pub tenant: &'a str,
    pub shim_id: &'a str,
    /// The epoch the agent reported (`GetEpoch`) just before.
    pub epoch: &'a [u8],
    /// Milliseconds since the Unix epoch when the proof was made.
    pub timestamp_ms: u64,
    pub nonce: &'a [u8],
}

fn message(c: &SessionClaim<'_>) -> Vec<u8> {
    // The epoch goes in as hex, so none of its bytes can pass for a separator.
    let epoch: String = c.epoch.iter().map(|b| format!("{b:02x}")).collect();
    let timestamp = c.timestamp_ms.to_string();
    let mut m = Vec::with_capacity(CONTEXT.len() + c.tenant.len() + c.shim_id.len() + epoch.len() + 48);
    for part in [CONTEXT, c.tenant.as_bytes(), c.shim_id.as_bytes(), epoch.as_bytes(), timestamp.as_bytes()] {
        m.extend_from_slice(part);
        m.push(0);
    }
    m.extend_from_slice(c.nonce);
    m
}

/// The proof a shim sends with OpenSession.
pub fn session_proof(secret: &[u8], claim: &SessionClaim<'_>) -> Vec<u8> {
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret);
    hmac::sign(&key, &message(claim)).as_ref().to_vec()
}

/// Checks a proof in constant time.
pub fn verify_session_proof(secret: &[u8], claim: &SessionClaim<'_>, proof: &[u8]) -> bool {
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret);
    hmac::verify(&key, &message(claim), proof).is_ok()
}

fn random<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    // getrandom failing is not recoverable (ring documents it as practically
    // impossible on Linux).
    SystemRandom::new().fill(&mut b).expect("system random number generator failed");
    b
}

/// A fresh random nonce.
pub fn new_nonce() -> [u8; NONCE_BYTES] {
    random()
}

/// A new agent epoch (one per agent start).
pub fn new_epoch() -> [u8; EPOCH_BYTES] {
    random()
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proof_binds_every_field() {
        let s = b"0123456789abcdef-secret";
        let (n, e) = ([7u8; NONCE_BYTES], [9u8; EPOCH_BYTES]);
        let c = SessionClaim { tenant: "alpha", shim_id: "shim-1", epoch: &e, timestamp_ms: 1000, nonce: &n };
        let p = session_proof(s, &c);
        assert!(verify_session_proof(s, &c, &p));
        assert!(!verify_session_proof(s, &SessionClaim { tenant: "beta", ..c }, &p));
        assert!(!verify_session_proof(s, &SessionClaim { shim_id: "shim-2", ..c }, &p));
        assert!(!verify_session_proof(s, &SessionClaim { timestamp_ms: 1001, ..c }, &p));
        assert!(!verify_session_proof(s, &SessionClaim { nonce: &[8u8; NONCE_BYTES], ..c }, &p));
        assert!(!verify_session_proof(s, &SessionClaim { epoch: &[10u8; EPOCH_BYTES], ..c }, &p), "another epoch");
        assert!(!verify_session_proof(s, &SessionClaim { epoch: &[], ..c }, &p), "no epoch");
        assert!(!verify_session_proof(b"another-secret-0123", &c, &p));
        // Field boundaries are unambiguous: ("alp", "ha\0shim") != ("alpha", "shim").
        assert!(!verify_session_proof(s, &SessionClaim { tenant: "alp", shim_id: "ha", ..c }, &p));
        assert!(!verify_session_proof(s, &c, &p[..31]));
    }

    #[test]
    fn secret_files_must_be_private_and_long_enough() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("sluice-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("alpha.secret");
        std::fs::write(&f, "a-long-enough-secret\n").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(read_secret_file(&f), Err(SecretFileError::Mode { mode: 0o644, .. })));
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_secret_file(&f).unwrap(), b"a-long-enough-secret");
        std::fs::write(&f, "short").unwrap();
        assert!(matches!(read_secret_file(&f), Err(SecretFileError::TooShort { len: 5, .. })));
        std::fs::remove_dir_all(&dir).ok();
    }
}
