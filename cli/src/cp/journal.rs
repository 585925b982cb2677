//! What a `sluice cp` run remembers: the journal that lets a run that was
//! stopped resume where it was, and the manifest that `cp -r` uploads leave
//! next to the objects so downloads can check every file's CRC64NVME.
//!
//! The journal is one JSON file per (direction, tenant, remote path, local
//! path) under the state directory (`--state-dir`, else
//! `$XDG_STATE_HOME/sluice/cp`, else `~/.local/state/sluice/cp`), nothing
//! in the trees being copied. It is rewritten whole (temp file + rename)
//! after objects complete: each completion either writes it or finds a
//! write under way that will include it. Nothing in it is trusted alone:
//! an upload is skipped only if the object still has the recorded size and
//! ETag, a download only if the file still has the recorded size and mtime
//! (or its CRC64NVME is the recorded one).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// The manifest's name, at the top of the prefix a `cp -r` upload wrote.
pub const MANIFEST_NAME: &str = ".sluice-cp.json";

const JOURNAL_VERSION: u32 = 1;
const MANIFEST_VERSION: u32 = 1;

/// One object copied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub size: u64,
    /// The local file's mtime (ns since the epoch) when it was read
    /// (upload) or right after it was written (download).
    pub mtime_ns: i64,
    /// The object's ETag, without quotes.
    pub etag: String,
    /// CRC64NVME of the bytes (16 hex digits).
    pub crc64nvme: String,
}

/// The journal file's contents.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct State {
    pub version: u32,
    /// "upload" or "download".
    pub direction: String,
    pub tenant: String,
    /// "namespace/prefix-or-key".
    pub remote: String,
    /// The local file or directory (absolute).
    pub local: String,
    /// Object key (without the namespace) -> what was copied.
    pub objects: BTreeMap<String, Entry>,
    /// The manifest this journal's uploads last wrote (so a run that
    /// changes nothing does not write it again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest: Option<WrittenManifest>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WrittenManifest {
    pub etag: String,
    pub manifest: Manifest,
}

/// `<prefix>/.sluice-cp.json`: every object a `cp -r` upload wrote under
/// the prefix (and still there with the same ETag), with its CRC64NVME.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub version: u32,
    /// Key relative to the manifest's prefix -> the object.
    pub objects: BTreeMap<String, ManifestEntry>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestEntry {
    pub size: u64,
    pub etag: String,
    pub crc64nvme: String,
}

impl Manifest {
    pub fn new(objects: BTreeMap<String, ManifestEntry>) -> Self {
        Self { version: MANIFEST_VERSION, objects }
    }

    pub fn parse(bytes: &[u8]) -> anyhow::Result<Self> {
        let m: Self = serde_json::from_slice(bytes)?;
        anyhow::ensure!(
            m.version == MANIFEST_VERSION,
            "manifest version {} (this sluice reads {MANIFEST_VERSION})",
            m.version
        );
        Ok(m)
    }
}

/// Where journals live: `--state-dir`, else `$XDG_STATE_HOME/sluice/cp`,
/// else `$HOME/.local/state/sluice/cp`.
pub fn state_dir(flag: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(d) = flag {
        return Ok(d.to_owned());
    }
    let from_env = |var: &str| std::env::var_os(var).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(x) = from_env("XDG_STATE_HOME").filter(|p| p.is_absolute()) {
        return Ok(x.join("sluice/cp"));
    }
    match from_env("HOME") {
        Some(h) => Ok(h.join(".local/state/sluice/cp")),
        None => anyhow::bail!("no place for the resume journal: set --state-dir (or $XDG_STATE_HOME or $HOME)"),
    }
}

/// The journal of one (direction, tenant, remote, local) pair in `dir`.
pub fn journal_path(dir: &Path, direction: &str, tenant: &str, remote: &str, local: &Path) -> PathBuf {
    let id = [direction, tenant, remote, &local.to_string_lossy()].join("\0");
    let digest = ring::digest::digest(&ring::digest::SHA256, id.as_bytes());
    dir.join(format!("{direction}-{}.json", &hex::encode(digest)[..32]))
}

/// Writes `bytes` to `path` through a temp file and a rename: a reader (or
/// the next run, after a kill) sees the old contents or the new, never a
/// mix.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

struct Inner {
    state: State,
    /// Bumped by every change; `written` is the value last on disk.
    generation: u64,
    written: u64,
}

/// A journal being kept during a run.
pub struct Journal {
    path: PathBuf,
    inner: Mutex<Inner>,
    writing: tokio::sync::Mutex<()>,
}

impl Journal {
    /// Opens the journal at `path`, or starts a fresh one like `fresh`
    /// (also when the file is unreadable or of another run: said in the
    /// returned note).
    pub fn open(path: PathBuf, fresh: State) -> (Self, Option<String>) {
        let mut note = None;
        let state = match std::fs::read(&path) {
            Ok(bytes) => match serde_json::from_slice::<State>(&bytes) {
                Ok(s)
                    if s.version == JOURNAL_VERSION
                        && s.direction == fresh.direction
                        && s.remote == fresh.remote
                        && s.local == fresh.local =>
                {
                    s
                }
                Ok(_) => {
                    note = Some(format!("ignoring {}: a journal of another copy", path.display()));
                    fresh
                }
                Err(e) => {
                    note = Some(format!("ignoring the unreadable journal {}: {e}", path.display()));
                    fresh
                }
            },
            Err(_) => fresh,
        };
        let state = State { version: JOURNAL_VERSION, ..state };
        (
            Self { path, inner: Mutex::new(Inner { state, generation: 0, written: 0 }), writing: Default::default() },
            note,
        )
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(&self, key: &str) -> Option<Entry> {
        self.lock().state.objects.get(key).cloned()
    }

    pub fn manifest(&self) -> Option<WrittenManifest> {
        self.lock().state.manifest.clone()
    }

    pub fn record(&self, key: &str, entry: Entry) {
        let mut g = self.lock();
        g.state.objects.insert(key.to_owned(), entry);
        g.generation += 1;
    }

    pub fn set_manifest(&self, m: WrittenManifest) {
        let mut g = self.lock();
        g.state.manifest = Some(m);
        g.generation += 1;
    }

    /// Writes the journal if it changed since it was last written. When
    /// another task is writing it already, returns at once: that writer
    /// loops until what it wrote is the latest.
    pub async fn flush(&self) -> anyhow::Result<()> {
        loop {
            let Ok(writing) = self.writing.try_lock() else { return Ok(()) };
            loop {
                let (generation, bytes) = {
                    let g = self.lock();
                    if g.generation == g.written {
                        break;
                    }
                    (g.generation, serde_json::to_vec(&g.state)?)
                };
                let path = self.path.clone();
                tokio::task::spawn_blocking(move || {
                    if let Some(dir) = path.parent() {
                        std::fs::create_dir_all(dir)?;
                    }
                    write_atomic(&path, &bytes)
                })
                .await??;
                self.lock().written = generation;
            }
            drop(writing);
            // A change recorded after the check above and before the lock
            // was dropped found the lock taken: write it now.
            let g = self.lock();
            if g.generation == g.written {
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fresh(remote: &str) -> State {
        State { direction: "upload".into(), remote: remote.into(), local: "/src".into(), ..Default::default() }
    }

    #[tokio::test]
    async fn records_survive_a_reopen_and_other_copies_start_fresh() {
        let dir = tempfile_dir();
        let path = journal_path(&dir, "upload", "alpha", "data/p/", Path::new("/src"));
        let (j, note) = Journal::open(path.clone(), fresh("data/p/"));
        assert!(note.is_none());
        let e = Entry { size: 3, mtime_ns: 7, etag: "abc".into(), crc64nvme: "00".into() };
        j.record("p/a", e.clone());
        j.flush().await.unwrap();
        let (again, _) = Journal::open(path.clone(), fresh("data/p/"));
        assert_eq!(again.get("p/a"), Some(e));
        let (other, note) = Journal::open(path.clone(), fresh("data/q/"));
        assert!(other.get("p/a").is_none());
        assert!(note.unwrap().contains("another copy"));
        std::fs::write(&path, b"{not json").unwrap();
        let (broken, note) = Journal::open(path, fresh("data/p/"));
        assert!(broken.get("p/a").is_none());
        assert!(note.unwrap().contains("unreadable"));
        let _ = std::fs::remove_dir_all(dir);
    }

    fn tempfile_dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("sluice-cp-journal-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn manifests_round_trip_and_refuse_other_versions() {
        let mut objects = BTreeMap::new();
        objects.insert("a/b".into(), ManifestEntry { size: 1, etag: "e".into(), crc64nvme: "c".into() });
        let m = Manifest::new(objects);
        assert_eq!(Manifest::parse(&serde_json::to_vec(&m).unwrap()).unwrap(), m);
        assert!(Manifest::parse(br#"{"version":9,"objects":{}}"#).is_err());
    }
}
