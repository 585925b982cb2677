//! Multipart uploads a killed agent leaves behind, and how its next start
//! aborts them.
//!
//! A running agent aborts every upload it gives up on (`put::MultipartUpload`
//! aborts on drop); one that is SIGKILLed, or whose host loses power, cannot.
//! Its uploads would stay in the store, holding their parts' bytes, until
//! a lifecycle rule expires them — and RGW has none unless one is set. So
//! the agent journals every upload it starts in `state_dir/uploads.journal`
//! and, when it starts, aborts those the last run left open.
//!
//! Write-ahead: an upload is journaled (written and fsynced) after the store
//! answered CreateMultipartUpload and before its id reaches the code that
//! sends parts (`guarded::Guarded::create_upload`), so no byte of a part is
//! sent for an upload that is not journaled. Crash windows:
//! * killed after the store created the upload and before the journal
//!   write: the upload is left, with no parts and no bytes (its id never
//!   reached us). Only the lifecycle rule removes it.
//! * killed mid-PUT (parts sent, not completed): journaled; aborted at the
//!   next start.
//! * killed after CompleteMultipartUpload succeeded, before the journal
//!   says so (the end of an upload is written without fsync): the next
//!   start aborts an upload that no longer exists; the store answers
//!   NoSuchUpload, which counts as done. The object is untouched.
//! * a torn last line (killed mid-write) is skipped: that upload is in the
//!   first case.
//! * a CreateMultipartUpload sent to a gateway that then hung (the request
//!   timed out and was sent again elsewhere) may still create an upload
//!   when that gateway wakes, under an id nobody knows. Such a "suspect"
//!   key is watched for 10 minutes: an upload of it that started after the
//!   request, is not one the agent has open, and has no part in two sweeps
//!   in a row (a writer's live upload gets parts) is aborted. Kept in
//!   memory only: an agent restarted meanwhile leaves it to the lifecycle
//!   rule.
//! * the journal lost with the disk, or the namespace removed from the
//!   config before the restart: the lifecycle rule (`[uploads]
//!   abort_incomplete_after_days`), if the operator allows it.
//!
//! The journal is an append-only text file (one line per upload started or
//! ended, fields percent-encoded), rewritten with only the open uploads at
//! start and whenever ended ones dominate it. A lock file keeps a second
//! agent from sharing the directory (it would abort the first one's live
//! uploads when it starts).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, CONTROLS};

use super::error::S3Error;

/// What a field may not hold as is: the separator, `%`, line breaks.
const FIELD: &AsciiSet = &CONTROLS.add(b' ').add(b'%');
const JOURNAL: &str = "uploads.journal";
const LOCK: &str = "agent.lock";
/// Ended entries kept before the file is rewritten.
const COMPACT_AFTER: usize = 4096;

/// Errors opening the journal.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UploadsError {
    #[error("state directory {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("state directory {0} is in use by another sluice-agent (its {LOCK} is locked); give each agent its own state_dir")]
    Locked(PathBuf),
}

/// An upload the agent started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// `tenant/namespace`.
    pub namespace: String,
    pub bucket: String,
    /// The stored key (namespace prefix included).
    pub key: String,
    pub upload_id: String,
}

struct Inner {
    file: File,
    open: BTreeMap<String, Entry>,
    /// Open uploads no request owns any more: left by the last run, or
    /// whose abort failed (a store down, an upload a hung gateway holds).
    abandoned: std::collections::BTreeSet<String>,
    /// Keys a hung gateway may create an unknown upload of, not yet
    /// handed to the sweeper.
    suspects: Vec<Suspect>,
    /// Lines in the file.
    lines: usize,
}

/// The journal of the uploads this agent has open.
pub struct Journal {
    dir: PathBuf,
    inner: Mutex<Inner>,
    /// Held for the agent's lifetime.
    _lock: nix::fcntl::Flock<File>,
}

fn field(s: &str) -> String {
    utf8_percent_encode(s, FIELD).to_string()
}

fn unfield(s: &str) -> Option<String> {
    percent_decode_str(s).decode_utf8().ok().map(|c| c.into_owned())
}

/// Parses the journal's lines into the uploads still open.
fn replay(text: impl BufRead) -> (BTreeMap<String, Entry>, usize) {
    let mut open = BTreeMap::new();
    let mut lines = 0;
    for line in text.lines().map_while(Result::ok) {
        lines += 1;
        let f: Vec<&str> = line.split(' ').collect();
        match f.as_slice() {
            ["S", ns, bucket, id, key] => {
                if let (Some(namespace), Some(bucket), Some(upload_id), Some(key)) =
                    (unfield(ns), unfield(bucket), unfield(id), unfield(key))
                {
                    open.insert(upload_id.clone(), Entry { namespace, bucket, key, upload_id });
                }
            }
            ["E", id] => {
                if let Some(id) = unfield(id) {
                    open.remove(&id);
                }
            }
            // Appended lines start with a line break (see `appended`).
            [""] => lines -= 1,
            // A torn line (the agent died, or a write failed, mid-line).
            _ => tracing::warn!(line, "upload journal: skipping an unreadable line"),
        }
    }
    (open, lines)
}

fn started_line(e: &Entry) -> String {
    format!("S {} {} {} {}\n", field(&e.namespace), field(&e.bucket), field(&e.upload_id), field(&e.key))
}

/// `line` as appended to a running journal: after a line break, so a line
/// a failed write left torn (a full disk takes part of a line) ends there
/// rather than run into this one and lose both (replay skips the empty
/// line this makes otherwise).
fn appended(line: &str) -> String {
    format!("\n{line}")
}

impl Journal {
    /// Opens the journal in `dir` (created, mode 0700), locked against
    /// another agent; also returns the uploads the last run left open.
    pub fn open(dir: &Path) -> Result<(Arc<Self>, Vec<Entry>), UploadsError> {
        use std::os::unix::fs::DirBuilderExt;
        let io = |source| UploadsError::Io { path: dir.to_owned(), source };
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(io)?;
        let lock = File::options().create(true).truncate(false).write(true).open(dir.join(LOCK)).map_err(io)?;
        let lock = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusiveNonblock)
            .map_err(|_| UploadsError::Locked(dir.to_owned()))?;
        let path = dir.join(JOURNAL);
        let (open, _) = match File::open(&path) {
            Ok(f) => replay(std::io::BufReader::new(f)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Default::default(),
            Err(e) => return Err(io(e)),
        };
        let left: Vec<Entry> = open.values().cloned().collect();
        let file = rewrite(dir, &open).map_err(io)?;
        let abandoned = open.keys().cloned().collect();
        let inner = Inner { file, lines: open.len(), open, abandoned, suspects: Vec::new() };
        Ok((Arc::new(Self { dir: dir.to_owned(), inner: Mutex::new(inner), _lock: lock }), left))
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records an upload as started, on disk (fsynced) before it returns.
    pub fn started(&self, e: Entry) -> std::io::Result<()> {
        let mut inner = self.lock();
        inner.file.write_all(appended(&started_line(&e)).as_bytes())?;
        inner.file.sync_data()?;
        inner.lines += 1;
        inner.open.insert(e.upload_id.clone(), e);
        Ok(())
    }

    /// Records an upload as ended (completed or aborted). Not fsynced: a
    /// lost end only costs an abort of an upload that is gone.
    pub fn ended(&self, upload_id: &str) -> std::io::Result<()> {
        let mut inner = self.lock();
        inner.abandoned.remove(upload_id);
        if inner.open.remove(upload_id).is_none() {
            return Ok(());
        }
        inner.file.write_all(appended(&format!("E {}\n", field(upload_id))).as_bytes())?;
        inner.lines += 1;
        if inner.lines > COMPACT_AFTER && inner.lines > 4 * inner.open.len() {
            inner.file = rewrite(&self.dir, &inner.open)?;
            inner.lines = inner.open.len();
        }
        Ok(())
    }

    /// The uploads open now.
    pub fn open_uploads(&self) -> Vec<Entry> {
        self.lock().open.values().cloned().collect()
    }

    /// Marks an open upload as one no request will end (its abort failed).
    pub fn abandon(&self, upload_id: &str) {
        let mut inner = self.lock();
        if inner.open.contains_key(upload_id) {
            inner.abandoned.insert(upload_id.to_owned());
        }
    }

    /// Records that a CreateMultipartUpload of `key` went unanswered.
    pub fn suspect(&self, namespace: &str, bucket: &str, key: &str) {
        let s = Suspect {
            namespace: namespace.to_owned(),
            bucket: bucket.to_owned(),
            key: key.to_owned(),
            since: SystemTime::now(),
            empty_once: Default::default(),
        };
        self.lock().suspects.push(s);
    }

    pub(super) fn take_suspects(&self) -> Vec<Suspect> {
        std::mem::take(&mut self.lock().suspects)
    }

    pub(super) fn is_open(&self, upload_id: &str) -> bool {
        self.lock().open.contains_key(upload_id)
    }

    /// The open uploads no request owns.
    pub fn abandoned(&self) -> Vec<Entry> {
        let inner = self.lock();
        inner.abandoned.iter().filter_map(|id| inner.open.get(id).cloned()).collect()
    }
}

/// Replaces the journal with one holding only `open` (written aside,
/// fsynced, renamed over it); returns it opened for appending.
fn rewrite(dir: &Path, open: &BTreeMap<String, Entry>) -> std::io::Result<File> {
    let (path, tmp) = (dir.join(JOURNAL), dir.join(format!("{JOURNAL}.tmp")));
    let mut f = File::create(&tmp)?;
    for e in open.values() {
        f.write_all(started_line(e).as_bytes())?;
    }
    f.sync_all()?;
    std::fs::rename(&tmp, &path)?;
    File::open(dir)?.sync_all()?;
    File::options().append(true).open(&path)
}

/// Marks an upload abandoned if the PUT that started it is dropped while
/// its start is being journaled (`std::mem::forget` it once written).
struct AbandonIfGone<'a> {
    gone: Arc<std::sync::atomic::AtomicBool>,
    journal: Arc<Journal>,
    upload_id: &'a str,
}

impl Drop for AbandonIfGone<'_> {
    fn drop(&mut self) {
        self.gone.store(true, std::sync::atomic::Ordering::SeqCst);
        self.journal.abandon(self.upload_id);
    }
}

/// One namespace's handle on the journal (what `Guarded` records with).
#[derive(Clone)]
pub struct UploadLog {
    journal: Arc<Journal>,
    namespace: String,
    bucket: String,
}

impl UploadLog {
    pub fn new(journal: Arc<Journal>, namespace: &str, bucket: &str) -> Self {
        Self { journal, namespace: namespace.to_owned(), bucket: bucket.to_owned() }
    }

    /// Journals an upload as started. A journal that cannot be written
    /// does not fail the PUT (the running agent still aborts what it
    /// gives up on); it is logged.
    pub async fn started(&self, key: &str, upload_id: &str) {
        let e = Entry {
            namespace: self.namespace.clone(),
            bucket: self.bucket.clone(),
            key: key.to_owned(),
            upload_id: upload_id.to_owned(),
        };
        // A caller gone while the write runs (its PUT cancelled) would
        // leave the upload open in the journal and never abandoned, so
        // neither aborted by the sweeper nor by the PUT: whichever of the
        // two sees the other's mark marks it abandoned.
        let gone = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let on_drop = AbandonIfGone { gone: gone.clone(), journal: self.journal.clone(), upload_id };
        let journal = self.journal.clone();
        let id = upload_id.to_owned();
        let written = tokio::task::spawn_blocking(move || {
            let r = journal.started(e);
            if gone.load(std::sync::atomic::Ordering::SeqCst) {
                journal.abandon(&id);
            }
            r
        })
        .await;
        std::mem::forget(on_drop);
        let error = match written {
            Ok(Ok(())) => return,
            Ok(Err(e)) => e.to_string(),
            Err(e) => e.to_string(),
        };
        tracing::error!(upload = upload_id, key, %error,
            "cannot journal the multipart upload: if the agent dies before it ends, it is left in the store");
    }

    /// An abort of the upload failed: the sweeper tries again.
    pub fn abandoned(&self, upload_id: &str) {
        self.journal.abandon(upload_id);
    }

    /// A CreateMultipartUpload of `key` was sent and not answered.
    pub fn suspect(&self, key: &str) {
        self.journal.suspect(&self.namespace, &self.bucket, key);
    }

    /// Journals an upload as ended (in the background).
    pub fn ended(&self, upload_id: &str) {
        let (journal, id) = (self.journal.clone(), upload_id.to_owned());
        let write = move || {
            if let Err(e) = journal.ended(&id) {
                tracing::warn!(upload = id, error = %e, "cannot journal the end of a multipart upload");
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn_blocking(write)),
            Err(_) => write(),
        }
    }
}

/// A key a gateway that hung may have created an unknown upload of.
#[derive(Clone, Debug)]
pub struct Suspect {
    pub(super) namespace: String,
    pub(super) bucket: String,
    pub(super) key: String,
    /// When the creation was sent.
    pub(super) since: SystemTime,
    /// Unknown uploads of it seen without parts once already.
    pub(super) empty_once: std::collections::BTreeSet<String>,
}

/// An upload in progress, as ListMultipartUploads names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    pub key: String,
    pub upload_id: String,
    pub initiated: Option<SystemTime>,
}

/// Parses a ListMultipartUploads reply.
pub(super) fn parse_listed(body: &str) -> Result<Vec<Listed>, S3Error> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct Upload {
        key: String,
        upload_id: String,
        #[serde(default)]
        initiated: String,
    }
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct Result {
        #[serde(default)]
        upload: Vec<Upload>,
    }
    let r: Result =
        quick_xml::de::from_str(body).map_err(|e| S3Error::Protocol(format!("ListMultipartUploads XML: {e}")))?;
    Ok(r.upload
        .into_iter()
        .map(|u| Listed {
            initiated: humantime::parse_rfc3339_weak(u.initiated.trim_end_matches('Z')).ok(),
            key: u.key,
            upload_id: u.upload_id,
        })
        .collect())
}

/// The parts in a ListParts reply.
pub(super) fn count_listed_parts(body: &str) -> usize {
    body.matches("<Part>").count()
}

#[cfg(test)]
#[path = "uploads_tests.rs"]
mod tests;
