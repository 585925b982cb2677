//! Master keys, key ids and the provider abstraction the agent resolves them through.

use std::collections::HashMap;
use std::fmt;
use std::sync::RwLock;

use ring::rand::{SecureRandom, SystemRandom};

use crate::CryptError;

/// Length of a master key and of a per-object data key (AES-256).
pub const KEY_LEN: usize = 32;
/// Longest key id; ids are stored in a fixed-size header field.
pub const KEY_ID_MAX_LEN: usize = 32;
/// Longest tenant name; tenants name a directory of the file provider.
pub const TENANT_MAX_LEN: usize = 64;
/// File name of the current-key pointer, so it can never be a key id.
pub(crate) const CURRENT_FILE: &str = "current";

/// Checks a name that ends up as a path component or header field: a restricted charset rules out
/// path traversal (`/`, `..`) and hidden/temporary files (leading `.`) by construction.
pub(crate) fn check_name(what: &'static str, name: &str, max: usize) -> Result<(), CryptError> {
    let ok = !name.is_empty()
        && name.len() <= max
        && !name.starts_with('.')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(CryptError::InvalidName { what, name: name.to_owned(), max })
    }
}

/// Validates a tenant name for use with key providers.
pub fn check_tenant(tenant: &str) -> Result<(), CryptError> {
    check_name("tenant", tenant, TENANT_MAX_LEN)
}

/// Identifier of one master key of a tenant: 1-32 characters from `[A-Za-z0-9._-]`, not starting
/// with `.`, and not `current`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyId(String);

impl KeyId {
    pub fn new(id: impl Into<String>) -> Result<Self, CryptError> {
        let id = id.into();
        check_name("key id", &id, KEY_ID_MAX_LEN)?;
        if id == CURRENT_FILE {
            return Err(CryptError::InvalidName { what: "key id", name: id, max: KEY_ID_MAX_LEN });
        }
        Ok(KeyId(id))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A tenant's 256-bit key-encryption key. `Debug` never prints the key bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct MasterKey([u8; KEY_LEN]);

/// Why a master key's hex text is not a key (never echoing the text,
/// which is secret).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum KeyHexError {
    #[error("expected 64 hex digits, found {0} characters")]
    Length(usize),
    #[error("contains a character that is not a hex digit")]
    NotHex,
}

impl MasterKey {
    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> Self {
        MasterKey(bytes)
    }

    /// A fresh key from the operating system's CSPRNG.
    pub fn generate() -> Result<Self, CryptError> {
        let mut bytes = [0u8; KEY_LEN];
        SystemRandom::new().fill(&mut bytes).map_err(|_| CryptError::Crypto("system random number generator"))?;
        Ok(MasterKey(bytes))
    }

    /// Parses exactly 64 hex digits (either case). The error never echoes the input, which is secret.
    pub fn from_hex(hex: &str) -> Result<Self, KeyHexError> {
        let digits = hex.as_bytes();
        if digits.len() != 2 * KEY_LEN {
            return Err(KeyHexError::Length(digits.len()));
        }
        let mut bytes = [0u8; KEY_LEN];
        for (byte, pair) in bytes.iter_mut().zip(digits.chunks_exact(2)) {
            match (hex_value(pair[0]), hex_value(pair[1])) {
                (Some(hi), Some(lo)) => *byte = hi << 4 | lo,
                _ => return Err(KeyHexError::NotHex),
            }
        }
        Ok(MasterKey(bytes))
    }

    /// Lower-case hex, the key-file encoding.
    pub fn to_hex(&self) -> String {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = String::with_capacity(2 * KEY_LEN);
        for b in self.0 {
            out.push(char::from(DIGITS[usize::from(b >> 4)]));
            out.push(char::from(DIGITS[usize::from(b & 0xf)]));
        }
        out
    }

    pub(crate) fn bytes(&self) -> &[u8; KEY_LEN] {
        &self.0
    }
}

fn hex_value(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

impl fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MasterKey(<redacted>)")
    }
}

/// Source of tenants' master keys.
///
/// `current` is used when sealing new objects; `get` when opening, with the id recorded in the
/// object's header, so rotated-out keys must stay available through `get` for as long as objects
/// sealed under them exist.
pub trait KeyProvider: Send + Sync {
    /// The key new objects of `tenant` are sealed under.
    fn current(&self, tenant: &str) -> Result<(KeyId, MasterKey), CryptError>;
    /// A specific key of `tenant`; [`CryptError::UnknownKey`] if it does not exist.
    fn get(&self, tenant: &str, id: &KeyId) -> Result<MasterKey, CryptError>;
}

/// In-memory provider for tests and embedding (keys configured programmatically).
#[derive(Debug, Default)]
pub struct MemoryKeyProvider {
    tenants: RwLock<HashMap<String, MemoryTenant>>,
}

#[derive(Debug, Default)]
struct MemoryTenant {
    keys: HashMap<KeyId, MasterKey>,
    current: Option<KeyId>,
}

impl MemoryKeyProvider {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) a key and makes it the tenant's current key.
    pub fn insert(&self, tenant: &str, id: KeyId, key: MasterKey) -> Result<(), CryptError> {
        check_tenant(tenant)?;
        // A poisoned lock only means another thread panicked mid-insert of a HashMap entry, which
        // leaves the map consistent; keep serving.
        let mut tenants = self.tenants.write().unwrap_or_else(|p| p.into_inner());
        let t = tenants.entry(tenant.to_owned()).or_default();
        t.keys.insert(id.clone(), key);
        t.current = Some(id);
        Ok(())
    }

    /// Points the tenant's current key at an existing key id.
    pub fn set_current(&self, tenant: &str, id: &KeyId) -> Result<(), CryptError> {
        let mut tenants = self.tenants.write().unwrap_or_else(|p| p.into_inner());
        match tenants.get_mut(tenant) {
            Some(t) if t.keys.contains_key(id) => {
                t.current = Some(id.clone());
                Ok(())
            }
            _ => Err(CryptError::UnknownKey { tenant: tenant.to_owned(), key_id: id.to_string() }),
        }
    }
}

impl KeyProvider for MemoryKeyProvider {
    fn current(&self, tenant: &str) -> Result<(KeyId, MasterKey), CryptError> {
        let tenants = self.tenants.read().unwrap_or_else(|p| p.into_inner());
        let t = tenants.get(tenant);
        match t.and_then(|t| t.current.as_ref().and_then(|id| t.keys.get(id).map(|k| (id.clone(), k.clone())))) {
            Some(found) => Ok(found),
            None => Err(CryptError::NoCurrentKey { tenant: tenant.to_owned() }),
        }
    }

    fn get(&self, tenant: &str, id: &KeyId) -> Result<MasterKey, CryptError> {
        let tenants = self.tenants.read().unwrap_or_else(|p| p.into_inner());
        tenants
            .get(tenant)
            .and_then(|t| t.keys.get(id).cloned())
            .ok_or_else(|| CryptError::UnknownKey { tenant: tenant.to_owned(), key_id: id.to_string() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["k1", "2024-01.key_A", "a"] {
            KeyId::new(ok).unwrap();
        }
        let long = "x".repeat(KEY_ID_MAX_LEN + 1);
        for bad in ["", ".hidden", "..", "a/b", "current", "sp ace", "ü", long.as_str()] {
            assert!(matches!(KeyId::new(bad), Err(CryptError::InvalidName { .. })), "{bad:?}");
        }
        assert!(check_tenant("../etc").is_err());
        check_tenant("acme-prod").unwrap();
    }

    #[test]
    fn hex_round_trip_and_redaction() {
        let k = MasterKey::generate().unwrap();
        assert_eq!(MasterKey::from_hex(&k.to_hex()).unwrap(), k);
        assert_eq!(MasterKey::from_hex(&k.to_hex().to_uppercase()).unwrap(), k);
        assert!(MasterKey::from_hex(&"g".repeat(64)).is_err());
        assert!(MasterKey::from_hex("00").is_err());
        assert!(!format!("{k:?}").contains(&k.to_hex()[..8]));
    }

    #[test]
    fn memory_provider() {
        let p = MemoryKeyProvider::new();
        assert!(matches!(p.current("t"), Err(CryptError::NoCurrentKey { .. })));
        let (k1, k2) = (KeyId::new("k1").unwrap(), KeyId::new("k2").unwrap());
        let m1 = MasterKey::generate().unwrap();
        p.insert("t", k1.clone(), m1.clone()).unwrap();
        p.insert("t", k2.clone(), MasterKey::generate().unwrap()).unwrap();
        assert_eq!(p.current("t").unwrap().0, k2);
        p.set_current("t", &k1).unwrap();
        assert_eq!(p.current("t").unwrap(), (k1.clone(), m1.clone()));
        assert_eq!(p.get("t", &k1).unwrap(), m1);
        assert!(matches!(p.get("u", &k1), Err(CryptError::UnknownKey { .. })));
    }
}
