//! Expiry of incomplete multipart uploads in the directory store, like S3's
//! `AbortIncompleteMultipartUpload` lifecycle rule: an upload that no client
//! completed or aborted within `expire_after` is removed with its parts, at
//! start and then periodically. Clients abort their own failed uploads (the
//! agent does, on every path); this is for uploads whose client died before
//! it could.
//!
//! Each upload is a directory under the store's `.sluice/uploads/` (see
//! `crate::store::multipart`); its age is that of its youngest file (a
//! part being received touches `upload.json` when it starts).

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use tracing::{info, warn};

/// What one sweep removed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Swept {
    pub uploads: usize,
    pub files: usize,
    pub bytes: u64,
}

fn age(meta: &std::fs::Metadata, now: SystemTime) -> Duration {
    meta.modified().ok().and_then(|m| now.duration_since(m).ok()).unwrap_or_default()
}

/// Removes every upload under `uploads` (the store's uploads directory)
/// whose youngest file is older than `expire_after`.
pub fn sweep(uploads: &Path, expire_after: Duration) -> std::io::Result<Swept> {
    let now = SystemTime::now();
    let mut swept = Swept::default();
    for entry in std::fs::read_dir(uploads)? {
        let entry = entry?;
        let dir = entry.path();
        let Ok(meta) = entry.metadata() else { continue };
        if !meta.is_dir() {
            continue;
        }
        let mut youngest = age(&meta, now);
        let (mut files, mut bytes) = (0usize, 0u64);
        // An upload completed or aborted since it was listed is simply
        // gone: the rest of the sweep goes on.
        let files_in = match std::fs::read_dir(&dir) {
            Ok(files_in) => files_in,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for f in files_in.flatten() {
            if let Ok(m) = f.metadata() {
                youngest = youngest.min(age(&m, now));
                files += 1;
                bytes += m.len();
            }
        }
        if youngest < expire_after {
            continue;
        }
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {
                swept.uploads += 1;
                swept.files += files;
                swept.bytes += bytes;
                info!(upload = %entry.file_name().to_string_lossy(), idle_secs = youngest.as_secs(), "expired an incomplete multipart upload");
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => warn!(path = %dir.display(), error = %e, "could not remove an expired upload"),
        }
    }
    Ok(swept)
}

/// Sweeps `root` now and then every `every` until the task is dropped.
pub async fn run(root: PathBuf, expire_after: Duration, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let (root, expire_after) = (root.clone(), expire_after);
        match tokio::task::spawn_blocking(move || sweep(&root, expire_after)).await {
            Ok(Ok(s)) if s.uploads > 0 => {
                info!(uploads = s.uploads, files = s.files, bytes = s.bytes, "expired incomplete multipart uploads")
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => warn!(error = %e, "sweeping incomplete multipart uploads failed"),
            Err(e) => warn!(error = %e, "the multipart sweep task failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn age_by(path: &Path, by: Duration) {
        std::fs::File::options().write(true).open(path).unwrap().set_modified(SystemTime::now() - by).unwrap();
    }

    #[test]
    fn only_idle_uploads_go() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for id in ["old", "new"] {
            std::fs::create_dir(root.join(id)).unwrap();
            std::fs::write(root.join(id).join("upload.json"), "{}").unwrap();
            std::fs::write(root.join(id).join("1"), vec![7u8; 1000]).unwrap();
            std::fs::write(root.join(id).join("1.json"), "{}").unwrap();
        }
        let long_ago = Duration::from_secs(3 * 3600);
        for f in ["upload.json", "1"] {
            age_by(&root.join("old").join(f), long_ago);
        }
        // The directory itself is young, and so is one of its files.
        assert_eq!(sweep(root, Duration::from_secs(3600)).unwrap(), Swept::default());
        age_by(&root.join("old/1.json"), long_ago);
        std::fs::File::open(root.join("old")).unwrap().set_modified(SystemTime::now() - long_ago).unwrap();
        let s = sweep(root, Duration::from_secs(3600)).unwrap();
        assert_eq!((s.uploads, s.files, s.bytes), (1, 3, 1004));
        assert!(!root.join("old").exists());
        assert!(root.join("new/1").exists());
    }
}
