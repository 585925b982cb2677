//! Master keys kept as files: `<root>/<tenant>/<key id>`, each holding 64 hex digits (plus an
//! optional trailing newline) and readable by the owner only.
//!
//! The current key of a tenant is named by `<root>/<tenant>/current` (the key id, surrounding
//! whitespace ignored); without that file it is the lexicographically (bytewise) greatest key id in
//! the directory. Rotation = add a key file, then point `current` at it; old ids stay readable.
//!
//! Caching: key files are immutable once written (a key id must never be reused for other bytes),
//! so loaded keys are cached until [`FileKeyProvider::reload`]. The `current` choice is re-read
//! when older than the configured TTL (default 1 s), so a rotation takes effect within a second
//! without a restart; `reload` forces it immediately. Unknown ids are not cached, so a key file
//! added later is found without a reload.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::keys::{check_tenant, KeyId, KeyProvider, MasterKey, CURRENT_FILE};
use crate::CryptError;

/// Default lifetime of a cached `current` choice.
pub const DEFAULT_CURRENT_TTL: Duration = Duration::from_secs(1);
/// A key file is 64 hex digits and a newline; anything much larger is not a key file.
const MAX_KEY_FILE_LEN: u64 = 128;

/// [`KeyProvider`] over a directory tree of key files.
#[derive(Debug)]
pub struct FileKeyProvider {
    root: PathBuf,
    current_ttl: Duration,
    keys: Mutex<HashMap<(String, KeyId), MasterKey>>,
    current: Mutex<HashMap<String, (Instant, KeyId)>>,
}

fn key_file_error(path: &Path, why: impl Into<String>) -> CryptError {
    CryptError::KeyFile { path: path.to_owned(), why: why.into() }
}

impl FileKeyProvider {
    /// Uses `root` as the key directory; fails if it is not a directory.
    pub fn new(root: impl Into<PathBuf>) -> Result<Self, CryptError> {
        let root = root.into();
        let meta = fs::metadata(&root).map_err(|e| CryptError::io(&root, e))?;
        if !meta.is_dir() {
            return Err(CryptError::io(&root, std::io::Error::new(ErrorKind::NotADirectory, "not a directory")));
        }
        Ok(FileKeyProvider {
            root,
            current_ttl: DEFAULT_CURRENT_TTL,
            keys: Mutex::default(),
            current: Mutex::default(),
        })
    }

    /// Sets how long a `current` lookup is reused; zero re-reads it on every call.
    pub fn with_current_ttl(mut self, ttl: Duration) -> Self {
        self.current_ttl = ttl;
        self
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Forgets all cached keys and `current` choices (e.g. after fixing a key file).
    pub fn reload(&self) {
        lock(&self.keys).clear();
        lock(&self.current).clear();
    }

    /// Writes a new random key file `<dir>/<tenant>/<id>` with mode 0600, creating the tenant
    /// directory (mode 0700) if needed. Never overwrites an existing key: objects sealed under it
    /// would become unreadable.
    pub fn create_key(dir: &Path, tenant: &str, id: &KeyId) -> Result<(), CryptError> {
        check_tenant(tenant)?;
        let tenant_dir = dir.join(tenant);
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&tenant_dir)
            .map_err(|e| CryptError::io(&tenant_dir, e))?;
        let path = tenant_dir.join(id.as_str());
        let key = MasterKey::generate()?;
        let mut file = match OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                return Err(key_file_error(&path, "already exists; key files are never overwritten"));
            }
            Err(e) => return Err(CryptError::io(&path, e)),
        };
        // The umask can only clear bits, but set the mode explicitly so the result never depends on it.
        let written = file
            .set_permissions(fs::Permissions::from_mode(0o600))
            .and_then(|()| file.write_all(format!("{}\n", key.to_hex()).as_bytes()))
            .and_then(|()| file.sync_all());
        written.map_err(|e| CryptError::io(&path, e))
    }

    /// Points `<dir>/<tenant>/current` at key `id` (which must exist), atomically via rename so a
    /// concurrent reader never sees a partial id.
    pub fn set_current(dir: &Path, tenant: &str, id: &KeyId) -> Result<(), CryptError> {
        check_tenant(tenant)?;
        let tenant_dir = dir.join(tenant);
        let key_path = tenant_dir.join(id.as_str());
        if !key_path.is_file() {
            return Err(CryptError::UnknownKey { tenant: tenant.to_owned(), key_id: id.to_string() });
        }
        // A leading '.' can never be a key id, so the temporary file is never mistaken for a key.
        let tmp = tenant_dir.join(format!(".{CURRENT_FILE}.{}.tmp", std::process::id()));
        let write = || -> std::io::Result<()> {
            let mut f = File::create(&tmp)?;
            f.write_all(format!("{id}\n").as_bytes())?;
            f.sync_all()?;
            fs::rename(&tmp, tenant_dir.join(CURRENT_FILE))
        };
        write().map_err(|e| {
            // Best effort: the temporary file is harmless but would be left behind.
            let _ = fs::remove_file(&tmp);
            CryptError::io(&tenant_dir, e)
        })
    }

    fn resolve_current(&self, tenant: &str) -> Result<KeyId, CryptError> {
        let tenant_dir = self.root.join(tenant);
        let pointer = tenant_dir.join(CURRENT_FILE);
        match fs::read_to_string(&pointer) {
            Ok(text) => {
                let id = text.trim();
                return KeyId::new(id).map_err(|_| key_file_error(&pointer, format!("{id:?} is not a valid key id")));
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(CryptError::io(&pointer, e)),
        }
        let entries = match fs::read_dir(&tenant_dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return Err(CryptError::NoCurrentKey { tenant: tenant.to_owned() });
            }
            Err(e) => return Err(CryptError::io(&tenant_dir, e)),
        };
        let mut best: Option<KeyId> = None;
        for entry in entries {
            let entry = entry.map_err(|e| CryptError::io(&tenant_dir, e))?;
            let Some(id) = entry.file_name().to_str().and_then(|n| KeyId::new(n).ok()) else { continue };
            // Follow symlinks (mounted secrets are often symlinks); skip directories and the like.
            if !entry.path().is_file() {
                continue;
            }
            if best.as_ref().is_none_or(|b| id.as_str().as_bytes() > b.as_str().as_bytes()) {
                best = Some(id);
            }
        }
        best.ok_or_else(|| CryptError::NoCurrentKey { tenant: tenant.to_owned() })
    }

    fn load_key(&self, tenant: &str, id: &KeyId) -> Result<MasterKey, CryptError> {
        let path = self.root.join(tenant).join(id.as_str());
        let unknown = || CryptError::UnknownKey { tenant: tenant.to_owned(), key_id: id.to_string() };
        let mut file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => return Err(unknown()),
            Err(e) => return Err(CryptError::io(&path, e)),
        };
        // Check the opened file, not the path, so a swap between check and read cannot slip through.
        let meta = file.metadata().map_err(|e| CryptError::io(&path, e))?;
        if !meta.is_file() {
            return Err(key_file_error(&path, "not a regular file"));
        }
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(CryptError::KeyFileMode { path, mode });
        }
        if meta.len() > MAX_KEY_FILE_LEN {
            return Err(key_file_error(&path, format!("{} bytes is too large for a key file", meta.len())));
        }
        let mut text = String::new();
        Read::by_ref(&mut file)
            .take(MAX_KEY_FILE_LEN)
            .read_to_string(&mut text)
            .map_err(|_| key_file_error(&path, "is not readable text"))?;
        let hex = text.strip_suffix('\n').unwrap_or(&text);
        MasterKey::from_hex(hex).map_err(|why| key_file_error(&path, why.to_string()))
    }
}

/// Lock a cache; a poisoned cache holds only complete entries, so keep using it.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl KeyProvider for FileKeyProvider {
    fn current(&self, tenant: &str) -> Result<(KeyId, MasterKey), CryptError> {
        check_tenant(tenant)?;
        let cached =
            lock(&self.current).get(tenant).filter(|(at, _)| at.elapsed() < self.current_ttl).map(|(_, id)| id.clone());
        let id = match cached {
            Some(id) => id,
            None => {
                let id = self.resolve_current(tenant)?;
                lock(&self.current).insert(tenant.to_owned(), (Instant::now(), id.clone()));
                id
            }
        };
        let key = self.get(tenant, &id)?;
        Ok((id, key))
    }

    fn get(&self, tenant: &str, id: &KeyId) -> Result<MasterKey, CryptError> {
        check_tenant(tenant)?;
        let cache_key = (tenant.to_owned(), id.clone());
        if let Some(key) = lock(&self.keys).get(&cache_key) {
            return Ok(key.clone());
        }
        // Loaded outside the lock so one slow disk read does not stall every other tenant.
        let key = self.load_key(tenant, id)?;
        lock(&self.keys).insert(cache_key, key.clone());
        Ok(key)
    }
}
