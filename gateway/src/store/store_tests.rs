//! The directory store's commits against what runs beside them.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use std::io::Write;

use super::*;

fn put(s: &DirStore, bucket: &str, key: &str, bytes: &[u8], content_type: &str) -> Result<ObjectMeta, StoreError> {
    let mut t = s.temp_file()?;
    t.file.as_mut().unwrap().write_all(bytes).unwrap();
    let meta = ObjectMeta { content_type: Some(content_type.into()), ..Default::default() };
    s.commit_object(bucket, key, t, meta, &WriteCond::Always)
}

/// A reader that found no metadata for a file computes it from the bytes;
/// if the writer's metadata arrived meanwhile, that is kept and returned
/// (the computed one has no content type, user metadata or checksums of
/// the writer's choosing, and it overwrote them).
#[test]
fn metadata_recovered_from_the_bytes_never_replaces_the_writers() {
    let d = tempfile::tempdir().unwrap();
    let s = DirStore::open(d.path()).unwrap();
    s.create_bucket("bkt").unwrap();
    put(&s, "bkt", "k", b"hello", "text/x-mine").unwrap();
    let path = d.path().join("bkt/k");
    let (file, st) = (std::fs::File::open(&path).unwrap(), std::fs::metadata(&path).unwrap());
    let m = s.recover_meta("bkt", "k", &file, &st).unwrap();
    assert_eq!(m.content_type.as_deref(), Some("text/x-mine"));
    assert_eq!(s.read_meta("bkt", "k").unwrap().content_type.as_deref(), Some("text/x-mine"));
}

/// DeleteBucket and a PUT into the bucket at once: either the PUT's object
/// stays (the bucket is not empty) or the PUT fails (no such bucket) —
/// never a PUT answered OK whose object went with the bucket, nor a
/// bucket the PUT made again after it was deleted.
#[test]
fn a_bucket_deleted_while_an_object_is_committed_keeps_it_or_refuses_it() {
    let d = tempfile::tempdir().unwrap();
    let s = std::sync::Arc::new(DirStore::open(d.path()).unwrap());
    for round in 0..200 {
        let bucket = format!("race{}", round % 7);
        s.create_bucket(&bucket).unwrap();
        let key = format!("deep/er/key{round}");
        let writer = {
            let (s, bucket, key) = (s.clone(), bucket.clone(), key.clone());
            std::thread::spawn(move || put(&s, &bucket, &key, b"x", "t").is_ok())
        };
        let deleted = s.delete_bucket(&bucket).unwrap();
        let stored = writer.join().unwrap();
        let exists = d.path().join(&bucket).join(&key).is_file();
        match (deleted, stored) {
            (true, true) => panic!("round {round}: the PUT was answered OK, and its bucket deleted"),
            (true, false) => assert!(!d.path().join(&bucket).exists(), "round {round}: the bucket came back"),
            (false, true) => {
                assert!(exists, "round {round}: the object of a PUT answered OK is gone");
                s.delete_object(&bucket, &key).unwrap();
                assert!(s.delete_bucket(&bucket).unwrap());
            }
            (false, false) => panic!("round {round}: the bucket was neither empty nor written"),
        }
    }
}

/// A store with bucket "bkt" and an upload to "k" of one part of `bytes`.
fn upload_with_one_part(
    bytes: &[u8],
) -> (tempfile::TempDir, DirStore, std::path::PathBuf, multipart::Upload, multipart::PartInfo) {
    let d = tempfile::tempdir().unwrap();
    let s = DirStore::open(d.path()).unwrap();
    s.create_bucket("bkt").unwrap();
    let meta = ObjectMeta::default();
    let up = multipart::Upload { bucket: "bkt".into(), key: "k".into(), meta, checksum_algorithm: None };
    let id = s.create_upload(&up).unwrap();
    let (dir, up) = s.upload(&id, "bkt", "k").unwrap();
    let mut tmp = s.temp_file().unwrap();
    tmp.file.as_mut().unwrap().write_all(bytes).unwrap();
    let md5 = s3s::crypto::Md5::checksum(bytes);
    let received = object::Received { tmp, md5, sums: Checksums::default(), size: bytes.len() as u64 };
    let info = s.put_part(&dir, 1, received).unwrap();
    (d, s, dir, up, info)
}

/// A part's bytes that are not the ones its record describes (a re-upload
/// whose record was never written) are refused at completion, not joined
/// into the object under the other bytes' ETag and CRC.
#[test]
fn a_part_whose_bytes_and_record_disagree_fails_the_completion() {
    let (d, s, dir, up, info) = upload_with_one_part(b"first bytes");
    // Other bytes, same size, in the part's place: the record still
    // describes the first ones.
    std::fs::write(dir.join("1.new"), b"other bytes").unwrap();
    std::fs::rename(dir.join("1.new"), dir.join("1")).unwrap();
    let wanted = std::sync::atomic::AtomicBool::new(false);
    let e = s.complete_upload(&dir, up, &[(1, info.etag.clone())], None, &WriteCond::Always, &wanted).unwrap_err();
    assert_eq!(e.code().as_str(), "InvalidPart", "{e:?}");
    assert!(!d.path().join("bkt/k").exists(), "nothing was committed");
}

/// A completion whose request was given up (its connection ended: the
/// gateway's idle limit, a client that hung up) while it assembled the
/// object commits nothing and keeps the upload, so the client's retry of
/// the completion finds it.
#[test]
fn a_completion_given_up_before_it_commits_changes_nothing() {
    let (d, s, dir, up, info) = upload_with_one_part(b"part one");
    let listed = [(1, info.etag.clone())];
    let gone = std::sync::atomic::AtomicBool::new(true);
    let e = s.complete_upload(&dir, up.clone(), &listed, None, &WriteCond::Always, &gone).unwrap_err();
    assert!(e.to_string().contains("nothing was changed"), "{e:?}");
    assert!(!d.path().join("bkt/k").exists() && dir.is_dir(), "no object, the upload kept");
    let wanted = std::sync::atomic::AtomicBool::new(false);
    s.complete_upload(&dir, up, &listed, None, &WriteCond::Always, &wanted).expect("the retry completes");
    assert_eq!(std::fs::read(d.path().join("bkt/k")).unwrap(), b"part one");
}
