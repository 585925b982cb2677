//! Expiry of incomplete multipart uploads in the directory store, like S3's
//! `AbortIncompleteMultipartUpload` lifecycle rule: an upload that no client
//! completed or aborted within `expire_after` is removed with its parts, at
//! start and then periodically. Clients abort their own failed uploads (the
//! agent does, on every path); this is for uploads whose client died before
//! it could.
//!
//! Layout of the directory store (s3s-fs) at its root:
//! `.upload-<uuid>.json` (the upload), `.upload_id-<uuid>.part-<n>` (its
//! parts), `.bucket-<b64>.object-<b64>.upload-<uuid>.metadata.json` (its
//! metadata).

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

/// The upload id a store file belongs to, if it is one of an upload's files.
fn upload_of(name: &str) -> Option<&str> {
    if let Some(rest) = name.strip_prefix(".upload-") {
        return rest.strip_suffix(".json");
    }
    if let Some(rest) = name.strip_prefix(".upload_id-") {
        return rest.split_once(".part-").map(|(id, _)| id);
    }
    if name.starts_with(".bucket-") {
        let rest = name.strip_suffix(".metadata.json")?;
        return rest.rsplit_once(".upload-").map(|(_, id)| id);
    }
    None
}

fn age(meta: &std::fs::Metadata, now: SystemTime) -> Duration {
    meta.modified().ok().and_then(|m| now.duration_since(m).ok()).unwrap_or_default()
}

/// Removes every upload under `root` whose newest file is older than
/// `expire_after` (a part still being written keeps its upload alive).
pub fn sweep(root: &Path, expire_after: Duration) -> std::io::Result<Swept> {
    let now = SystemTime::now();
    // upload id -> (its files, the youngest file's age)
    let mut uploads: std::collections::HashMap<String, (Vec<(PathBuf, u64)>, Duration)> = Default::default();
    for entry in std::fs::read_dir(root)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(id) = name.to_str().and_then(upload_of) else { continue };
        let Ok(meta) = entry.metadata() else { continue };
        let slot = uploads.entry(id.to_owned()).or_insert_with(|| (Vec::new(), Duration::MAX));
        slot.0.push((entry.path(), meta.len()));
        slot.1 = slot.1.min(age(&meta, now));
    }
    let mut swept = Swept::default();
    for (id, (files, youngest)) in uploads {
        if youngest < expire_after {
            continue;
        }
        for (path, len) in files {
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    swept.files += 1;
                    swept.bytes += len;
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => warn!(path = %path.display(), error = %e, "could not remove an expired upload's file"),
            }
        }
        swept.uploads += 1;
        info!(upload = %id, idle_secs = youngest.as_secs(), "expired an incomplete multipart upload");
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

    #[test]
    fn names_map_to_their_upload() {
        let id = "0b1c2d3e-0000-4000-8000-000000000001";
        assert_eq!(upload_of(&format!(".upload-{id}.json")), Some(id));
        assert_eq!(upload_of(&format!(".upload_id-{id}.part-17")), Some(id));
        assert_eq!(upload_of(&format!(".bucket-ZGF0YQ.object-a2V5.upload-{id}.metadata.json")), Some(id));
        assert_eq!(upload_of(".bucket-ZGF0YQ.object-a2V5.metadata.json"), None, "a finished object's metadata");
        assert_eq!(upload_of(".bucket-ZGF0YQ.object-a2V5.internal.json"), None);
        assert_eq!(upload_of("data"), None);
    }

    #[test]
    fn only_idle_uploads_go() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let (old, new) = ("11111111-0000-4000-8000-000000000000", "22222222-0000-4000-8000-000000000000");
        for id in [old, new] {
            std::fs::write(root.join(format!(".upload-{id}.json")), "null").unwrap();
            std::fs::write(root.join(format!(".upload_id-{id}.part-1")), vec![7u8; 1000]).unwrap();
            std::fs::write(root.join(format!(".bucket-YQ.object-Yg.upload-{id}.metadata.json")), "{}").unwrap();
        }
        std::fs::create_dir(root.join("data")).unwrap();
        std::fs::write(root.join("data/object"), b"stays").unwrap();
        let long_ago = SystemTime::now() - Duration::from_secs(3 * 3600);
        for name in [format!(".upload-{old}.json"), format!(".upload_id-{old}.part-1")] {
            std::fs::File::options().write(true).open(root.join(name)).unwrap().set_modified(long_ago).unwrap();
        }
        // The old upload's metadata file is young: the upload is still in use.
        assert_eq!(sweep(root, Duration::from_secs(3600)).unwrap(), Swept::default());
        let meta = root.join(format!(".bucket-YQ.object-Yg.upload-{old}.metadata.json"));
        std::fs::File::options().write(true).open(&meta).unwrap().set_modified(long_ago).unwrap();
        let s = sweep(root, Duration::from_secs(3600)).unwrap();
        assert_eq!((s.uploads, s.files, s.bytes), (1, 3, 1006));
        let left: Vec<String> =
            std::fs::read_dir(root).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        assert_eq!(left.len(), 4, "{left:?}");
        assert!(left.iter().all(|n| !n.contains(old)), "{left:?}");
        assert_eq!(std::fs::read(root.join("data/object")).unwrap(), b"stays");
    }
}
