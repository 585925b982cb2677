//! The gateway's embedded S3 store: a local directory.
//!
//! Layout below the root:
//!
//! * `<bucket>/<key path>` — each object is a plain file holding exactly its
//!   bytes (key paths: [`keys`]). Files put there by hand are served too;
//!   their ETag is computed on first access.
//! * `.sluice/meta/<bucket>/<hh>/<sha256(key)>` — the object's metadata
//!   (ETag, checksums, content type, user metadata) as JSON, naming the
//!   inode of the data file it describes. A file and its metadata are
//!   replaced by two renames; a reader that finds them disagreeing (a writer
//!   between its renames, or a crash) re-reads, and never serves bytes under
//!   another version's ETag.
//! * `.sluice/uploads/<upload id>/` — multipart uploads in progress
//!   ([`multipart`]); `.sluice/tmp/` — files being written (emptied at start).
//!
//! Bucket names cannot start with `.`, so `.sluice` is never a bucket.

pub mod keys;
mod list;
mod multipart;
mod object;
mod s3;
#[cfg(test)]
mod store_tests;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use s3s::crypto::Checksum as _;
use serde::{Deserialize, Serialize};

pub use keys::KeyError;

/// What can go wrong in the store, before it becomes an S3 error.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("no such bucket {0:?}")]
    NoSuchBucket(String),
    #[error("no such key {0:?}")]
    NoSuchKey(String),
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error("{0}")]
    Precondition(String),
    /// The request's connection ended before the object was committed
    /// (nobody would be told it was): nothing was changed.
    #[error("the request was given up (its connection ended) before it committed; nothing was changed")]
    Abandoned,
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> StoreError {
    let what = what.into();
    move |source| StoreError::Io { what, source }
}

/// Everything the store keeps about an object besides its bytes.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ObjectMeta {
    /// Hex MD5 of the bytes, or `<hex>-<parts>` for a multipart object.
    pub etag: String,
    pub size: u64,
    /// Identity of the data file this describes (device, inode).
    pub dev: u64,
    pub ino: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_encoding: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_disposition: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_language: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_control: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    #[serde(default)]
    pub checksums: Checksums,
    /// Parts of a multipart object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parts: Option<u32>,
}

/// Full-object checksums (base64, as S3 sends them). CRC64NVME is always
/// computed, as S3 does for every new object; the others are kept when the
/// client sent them (and they matched).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Checksums {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crc64nvme: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crc32: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crc32c: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha1: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

/// A file being written under `.sluice/tmp`, removed unless committed.
pub struct TempFile {
    path: PathBuf,
    pub file: Option<std::fs::File>,
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.path.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// When a write may replace the current object (conditional writes).
#[derive(Debug, Clone, PartialEq)]
pub enum WriteCond {
    Always,
    /// `If-None-Match: *`: only if there is no object yet.
    IfAbsent,
    /// `If-Match: <etag>`: only if the current object has this ETag.
    IfMatch(String),
}

/// The directory store.
pub struct DirStore {
    root: PathBuf,
    /// Serialises the two renames that replace an object and its metadata
    /// (striped by key), so concurrent writers of one key cannot pair one's
    /// bytes with the other's metadata.
    stripes: Vec<Mutex<()>>,
    seq: AtomicU64,
    /// Commits hold it shared, DeleteBucket exclusively: a bucket found
    /// empty cannot get an object before it is removed (the object was
    /// then deleted with it after its PUT was answered), and a commit that
    /// found its bucket cannot create the directory again after it was
    /// deleted.
    buckets: std::sync::RwLock<()>,
}

impl DirStore {
    /// Opens (creating the internal directories) the store at `root` and
    /// clears leftovers of writes a previous run did not finish.
    pub fn open(root: &Path) -> Result<Self, StoreError> {
        let root = root.canonicalize().map_err(io(format!("data_dir {}", root.display())))?;
        for d in ["meta", "uploads", "tmp"] {
            let p = root.join(".sluice").join(d);
            std::fs::create_dir_all(&p).map_err(io(format!("creating {}", p.display())))?;
        }
        let tmp = root.join(".sluice/tmp");
        if let Ok(rd) = std::fs::read_dir(&tmp) {
            for e in rd.flatten() {
                let _ = std::fs::remove_file(e.path());
            }
        }
        Ok(Self {
            root,
            stripes: (0..64).map(|_| Mutex::new(())).collect(),
            seq: AtomicU64::new(0),
            buckets: std::sync::RwLock::new(()),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn uploads_dir(&self) -> PathBuf {
        self.root.join(".sluice/uploads")
    }

    /// The bucket's directory, if the bucket exists.
    pub fn bucket_dir(&self, bucket: &str) -> Result<PathBuf, StoreError> {
        if keys::check_bucket(bucket).is_err() {
            return Err(StoreError::NoSuchBucket(bucket.to_owned()));
        }
        let d = self.root.join(bucket);
        match std::fs::metadata(&d) {
            Ok(m) if m.is_dir() => Ok(d),
            _ => Err(StoreError::NoSuchBucket(bucket.to_owned())),
        }
    }

    /// Creates a bucket; `false` if it existed.
    pub fn create_bucket(&self, bucket: &str) -> Result<bool, StoreError> {
        keys::check_bucket(bucket)?;
        let d = self.root.join(bucket);
        match std::fs::create_dir(&d) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(io(format!("creating bucket {bucket}"))(e)),
        }
    }

    /// Names of the buckets.
    pub fn buckets(&self) -> Result<Vec<(String, std::time::SystemTime)>, StoreError> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(&self.root).map_err(io("reading data_dir"))?.flatten() {
            let Some(name) = e.file_name().to_str().map(str::to_owned) else { continue };
            let Ok(m) = e.metadata() else { continue };
            if m.is_dir() && keys::check_bucket(&name).is_ok() {
                out.push((name, m.modified().unwrap_or(std::time::UNIX_EPOCH)));
            }
        }
        out.sort();
        Ok(out)
    }

    fn meta_path(&self, bucket: &str, key: &str) -> PathBuf {
        let h = hex::encode(s3s::crypto::Sha256::checksum(key.as_bytes()));
        self.root.join(".sluice/meta").join(bucket).join(&h[..2]).join(h)
    }

    fn stripe(&self, key: &str) -> std::sync::MutexGuard<'_, ()> {
        let h = key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x1_0000_0000_01b3));
        self.stripes[(h % self.stripes.len() as u64) as usize].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new empty file under `.sluice/tmp`.
    pub fn temp_file(&self) -> Result<TempFile, StoreError> {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        let path = self.root.join(".sluice/tmp").join(format!("{}-{n}", std::process::id()));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(io("creating a temporary file"))?;
        Ok(TempFile { path, file: Some(file) })
    }

    /// Opens an object for reading: its file and the metadata that belongs
    /// to exactly that file.
    pub fn open_object(
        &self,
        bucket: &str,
        key: &str,
    ) -> Result<(std::fs::File, ObjectMeta, std::fs::Metadata), StoreError> {
        let dir = self.bucket_dir(bucket)?;
        let rel = keys::key_to_path(key).map_err(|_| StoreError::NoSuchKey(key.to_owned()))?;
        let path = dir.join(rel);
        let no_key = || StoreError::NoSuchKey(key.to_owned());
        for attempt in 0..8 {
            let file = match std::fs::File::open(&path) {
                Ok(f) => f,
                Err(e) if is_missing(&e) => return Err(no_key()),
                Err(e) => return Err(io(format!("opening {key:?}"))(e)),
            };
            let st = file.metadata().map_err(io(format!("stat of {key:?}")))?;
            if !st.is_file() {
                return Err(no_key());
            }
            if let Some(m) = self.read_meta(bucket, key) {
                if m.dev == st.dev() && m.ino == st.ino() && m.size == st.len() {
                    return Ok((file, m, st));
                }
            }
            if attempt < 7 {
                // A writer between its two renames: look again shortly.
                std::thread::sleep(Duration::from_micros(200 << attempt.min(4)));
                continue;
            }
            // No metadata for this file (put there by hand, or a writer
            // died between its renames): compute it from the bytes.
            let meta = self.recover_meta(bucket, key, &file, &st)?;
            return Ok((file, meta, st));
        }
        unreachable!("the loop returns on its last attempt")
    }

    fn read_meta(&self, bucket: &str, key: &str) -> Option<ObjectMeta> {
        let bytes = std::fs::read(self.meta_path(bucket, key)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    fn recover_meta(
        &self,
        bucket: &str,
        key: &str,
        file: &std::fs::File,
        st: &std::fs::Metadata,
    ) -> Result<ObjectMeta, StoreError> {
        let meta = compute_meta(key, file, st)?;
        // Remember it, unless the object changed meanwhile, or its writer
        // has written its metadata since (it has the content type, user
        // metadata and checksums the bytes alone do not tell).
        if meta.size == st.len() {
            let _g = self.stripe(key);
            if let Some(theirs) = self.read_meta(bucket, key) {
                if theirs.dev == st.dev() && theirs.ino == st.ino() && theirs.size == st.len() {
                    return Ok(theirs);
                }
            }
            let current = self.bucket_dir(bucket).ok().and_then(|d| {
                let rel = keys::key_to_path(key).ok()?;
                std::fs::metadata(d.join(rel)).ok()
            });
            if current.is_some_and(|c| c.ino() == st.ino() && c.dev() == st.dev()) {
                let _ = self.write_meta(bucket, key, &meta);
            }
        }
        Ok(meta)
    }

    fn write_meta(&self, bucket: &str, key: &str, meta: &ObjectMeta) -> Result<(), StoreError> {
        let t = self.meta_file(bucket, key, meta)?;
        self.place_meta(bucket, key, t)
    }

    /// `meta` written to a temporary file, its directory made: everything
    /// that can fail for want of room, done before anything is replaced.
    fn meta_file(&self, bucket: &str, key: &str, meta: &ObjectMeta) -> Result<TempFile, StoreError> {
        let path = self.meta_path(bucket, key);
        let dir = path.parent().expect("meta path has a parent");
        std::fs::create_dir_all(dir).map_err(io("creating a metadata directory"))?;
        let mut t = self.temp_file()?;
        let mut f = t.file.take().expect("fresh temp file");
        f.write_all(&serde_json::to_vec(meta).expect("metadata serialises")).map_err(io("writing metadata"))?;
        Ok(t)
    }

    fn place_meta(&self, bucket: &str, key: &str, mut t: TempFile) -> Result<(), StoreError> {
        std::fs::rename(&t.path, self.meta_path(bucket, key)).map_err(io("committing metadata"))?;
        t.path = PathBuf::new();
        Ok(())
    }

    /// Makes the written temp file the object `key`, with `meta` (whose
    /// identity fields are filled in here). Refuses keys the file system
    /// cannot hold beside the existing ones.
    pub fn commit_object(
        &self,
        bucket: &str,
        key: &str,
        tmp: TempFile,
        meta: ObjectMeta,
        cond: &WriteCond,
    ) -> Result<ObjectMeta, StoreError> {
        static WANTED: AtomicBool = AtomicBool::new(false);
        self.commit_object_unless(bucket, key, tmp, meta, cond, &WANTED)
    }

    /// [`Self::commit_object`], unless `gone` is set by the time it would
    /// replace the object ([`StoreError::Abandoned`]): a request served on
    /// a blocking thread (a completion, a copy) goes on after its
    /// connection ended, and must not commit what its client was never
    /// told of (a client that retried would find its upload gone).
    pub fn commit_object_unless(
        &self,
        bucket: &str,
        key: &str,
        mut tmp: TempFile,
        mut meta: ObjectMeta,
        cond: &WriteCond,
        gone: &AtomicBool,
    ) -> Result<ObjectMeta, StoreError> {
        let _bucket_stays = self.buckets.read().unwrap_or_else(|p| p.into_inner());
        let dir = self.bucket_dir(bucket)?;
        let rel = keys::key_to_path(key)?;
        let path = dir.join(&rel);
        let st = std::fs::metadata(&tmp.path).map_err(io("stat of the written object"))?;
        meta.dev = st.dev();
        meta.ino = st.ino();
        meta.size = st.len();
        let conflict = |why: String| StoreError::Key(KeyError::Conflict { key: key.to_owned(), why });
        // Written before the object is replaced: a PUT that fails for want
        // of room changes nothing (it replaced the object, then failed).
        let mut meta_tmp = Some(self.meta_file(bucket, key, &meta)?);
        // A concurrent delete may prune the parent directory between
        // creating it and the rename: try again then.
        for attempt in 0..4 {
            if let Some(parent) = path.parent() {
                if let Err(e) = std::fs::create_dir_all(parent) {
                    if matches!(e.raw_os_error(), Some(libc::ENOTDIR) | Some(libc::EEXIST)) {
                        return Err(conflict(format!("a prefix of it is already an object ({})", parent_key(&rel))));
                    }
                    return Err(io(format!("creating the directories of {key:?}"))(e));
                }
            }
            if std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) && std::fs::remove_dir(&path).is_err() {
                return Err(conflict(format!("other objects have keys starting with \"{key}/\"")));
            }
            let _g = self.stripe(key);
            self.check_write(bucket, key, &path, cond)?;
            if gone.load(Ordering::Acquire) {
                return Err(StoreError::Abandoned);
            }
            match std::fs::rename(&tmp.path, &path) {
                Ok(()) => {
                    tmp.path = PathBuf::new();
                    let t = meta_tmp.take().expect("placed once");
                    self.place_meta(bucket, key, t)?;
                    return Ok(meta);
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && attempt < 3 => continue,
                Err(e) if e.raw_os_error() == Some(libc::EISDIR) || e.raw_os_error() == Some(libc::ENOTEMPTY) => {
                    return Err(conflict(format!("other objects have keys starting with \"{key}/\"")))
                }
                Err(e) => return Err(io(format!("committing {key:?}"))(e)),
            }
        }
        Err(StoreError::Io { what: format!("committing {key:?}"), source: std::io::ErrorKind::NotFound.into() })
    }

    /// Checks a write condition against the current object (under its lock).
    fn check_write(&self, bucket: &str, key: &str, path: &Path, cond: &WriteCond) -> Result<(), StoreError> {
        let current = || std::fs::metadata(path).ok().filter(|m| m.is_file());
        match cond {
            WriteCond::Always => Ok(()),
            WriteCond::IfAbsent if current().is_some() => {
                Err(StoreError::Precondition(format!("If-None-Match: * but {key:?} exists")))
            }
            WriteCond::IfAbsent => Ok(()),
            WriteCond::IfMatch(want) => {
                let Some(st) = current() else {
                    return Err(StoreError::Precondition(format!("If-Match: {key:?} does not exist")));
                };
                let etag = match self.read_meta(bucket, key) {
                    Some(m) if m.ino == st.ino() && m.dev == st.dev() => m.etag,
                    _ => {
                        let f = std::fs::File::open(path).map_err(io(format!("opening {key:?}")))?;
                        compute_meta(key, &f, &st)?.etag
                    }
                };
                if etag != want.trim_matches('"') {
                    return Err(StoreError::Precondition(format!("If-Match: {key:?} has ETag \"{etag}\"")));
                }
                Ok(())
            }
        }
    }

    /// Removes an object and its metadata; `Ok` if it did not exist.
    /// Directories left empty are removed up to the bucket.
    pub fn delete_object(&self, bucket: &str, key: &str) -> Result<(), StoreError> {
        let dir = self.bucket_dir(bucket)?;
        let Ok(rel) = keys::key_to_path(key) else { return Ok(()) };
        let path = dir.join(&rel);
        {
            let _g = self.stripe(key);
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if is_missing(&e) || e.raw_os_error() == Some(libc::EISDIR) => return Ok(()),
                Err(e) => return Err(io(format!("deleting {key:?}"))(e)),
            }
            let _ = std::fs::remove_file(self.meta_path(bucket, key));
        }
        let mut p = path.parent();
        while let Some(d) = p {
            if d == dir || std::fs::remove_dir(d).is_err() {
                break;
            }
            p = d.parent();
        }
        Ok(())
    }

    /// Removes an empty bucket.
    pub fn delete_bucket(&self, bucket: &str) -> Result<bool, StoreError> {
        let _no_commits = self.buckets.write().unwrap_or_else(|p| p.into_inner());
        let dir = self.bucket_dir(bucket)?;
        let empty = list::first_object(&dir)?.is_none();
        if !empty {
            return Ok(false);
        }
        std::fs::remove_dir_all(&dir).map_err(io(format!("removing bucket {bucket}")))?;
        let _ = std::fs::remove_dir_all(self.root.join(".sluice/meta").join(bucket));
        Ok(true)
    }
}

/// Metadata of a file the store has none for: its digests, read from it.
fn compute_meta(key: &str, file: &std::fs::File, st: &std::fs::Metadata) -> Result<ObjectMeta, StoreError> {
    let mut md5 = s3s::crypto::Md5::new();
    let mut crc = s3s::crypto::Crc64Nvme::new();
    let mut r = std::io::BufReader::with_capacity(1 << 20, file);
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = r.read(&mut buf).map_err(io(format!("reading {key:?}")))?;
        if n == 0 {
            break;
        }
        md5.update(&buf[..n]);
        crc.update(&buf[..n]);
        size += n as u64;
    }
    Ok(ObjectMeta {
        etag: hex::encode(md5.finalize()),
        size,
        dev: st.dev(),
        ino: st.ino(),
        checksums: Checksums { crc64nvme: Some(b64(&crc.finalize())), ..Default::default() },
        ..Default::default()
    })
}

/// The key of the deepest existing ancestor in `rel` (for messages).
fn parent_key(rel: &Path) -> String {
    rel.parent().and_then(keys::path_to_key).unwrap_or_default()
}

fn is_missing(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ENOTDIR)
}

pub(crate) fn b64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

pub use object::{get_output, Opened};
pub use s3::{open_for_get, Auth, Store};
