//! Multipart uploads: `.sluice/uploads/<upload id>/` holds `upload.json`
//! (bucket, key, the object's attributes) and, per part `n`, the file
//! `<n>` and its digests `<n>.json`. Completing concatenates the parts
//! in the kernel (copy_file_range) and combines their CRC64NVMEs, so no
//! byte is read twice; aborting (or expiry, see `crate::expiry`) removes
//! the directory.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::SystemTime;

use s3s::crypto::Checksum as _;
use s3s::{s3_error, S3Result};
use serde::{Deserialize, Serialize};

use super::{b64, Checksums, DirStore, ObjectMeta, StoreError};

/// Parts other than the last must be at least this big (as S3).
pub const MIN_PART_BYTES: u64 = 5 << 20;
/// Part numbers S3 allows.
pub const MAX_PART_NUMBER: i32 = 10_000;

/// What `upload.json` holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Upload {
    pub bucket: String,
    pub key: String,
    /// The object's attributes (the ETag and identity are filled in at
    /// completion).
    pub meta: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum_algorithm: Option<String>,
}

/// What `<n>.json` holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartInfo {
    pub etag: String,
    pub size: u64,
    /// CRC64NVME of the part, as a number (combined at completion).
    pub crc64: u64,
    /// The inode of the part's bytes this describes (0: written before it
    /// was recorded): a record and bytes that are not each other's (a
    /// re-upload whose record was not written) are refused at completion.
    #[serde(default)]
    pub ino: u64,
}

fn io(what: &str) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io { what: what.to_owned(), source }
}

fn no_upload(id: &str) -> s3s::S3Error {
    s3_error!(NoSuchUpload, "no multipart upload {id:?} (completed, aborted, expired or never created)")
}

impl DirStore {
    /// The directory of upload `id`; ids are 32 lower-case hex digits, so a
    /// client-supplied id never names another path.
    fn upload_dir(&self, id: &str) -> S3Result<PathBuf> {
        if id.len() != 32 || !id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            return Err(no_upload(id));
        }
        let d = self.uploads_dir().join(id);
        d.is_dir().then_some(d).ok_or_else(|| no_upload(id))
    }

    /// The upload `id`, checked to be for `bucket`/`key`.
    pub fn upload(&self, id: &str, bucket: &str, key: &str) -> S3Result<(PathBuf, Upload)> {
        let dir = self.upload_dir(id)?;
        let raw = std::fs::read(dir.join("upload.json")).map_err(|_| no_upload(id))?;
        let up: Upload = serde_json::from_slice(&raw).map_err(|_| no_upload(id))?;
        if up.bucket != bucket || up.key != key {
            return Err(no_upload(id));
        }
        Ok((dir, up))
    }

    pub fn create_upload(&self, up: &Upload) -> Result<String, StoreError> {
        self.bucket_dir(&up.bucket)?;
        super::keys::key_to_path(&up.key)?;
        let seed = format!(
            "{:?}-{}-{}",
            SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default(),
            std::process::id(),
            self.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let id = hex::encode(&s3s::crypto::Sha256::checksum(seed.as_bytes())[..16]);
        let dir = self.uploads_dir().join(&id);
        std::fs::create_dir(&dir).map_err(io("creating the upload"))?;
        std::fs::write(dir.join("upload.json"), serde_json::to_vec(up).expect("serialises"))
            .map_err(io("writing the upload"))?;
        Ok(id)
    }

    /// Stores a received part (replacing an earlier one with its number).
    pub fn put_part(&self, dir: &std::path::Path, n: i32, mut r: super::object::Received) -> S3Result<PartInfo> {
        if !(1..=MAX_PART_NUMBER).contains(&n) {
            return Err(s3_error!(InvalidArgument, "part numbers are 1 to {MAX_PART_NUMBER}, not {n}"));
        }
        let crc = r.sums.crc64nvme.as_deref().and_then(crc_from_b64).unwrap_or(0);
        let stored = |e| super::s3::store_error(io("storing the part")(e));
        // A rename keeps the inode: the record names the bytes it describes.
        let ino = std::fs::metadata(&r.tmp.path).map_err(stored)?.ino();
        let info = PartInfo { etag: hex::encode(r.md5), size: r.size, crc64: crc, ino };
        // The record is written first, then both renamed under the part's
        // lock: nothing is replaced if there is no room for the record.
        let mut record = self.temp_file().map_err(super::s3::store_error)?;
        record
            .file
            .take()
            .expect("fresh temp file")
            .write_all(&serde_json::to_vec(&info).expect("serialises"))
            .map_err(stored)?;
        let _g = self.stripe(&format!("{}/{n}", dir.display()));
        std::fs::rename(&r.tmp.path, dir.join(n.to_string())).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                s3_error!(NoSuchUpload)
            } else {
                stored(e)
            }
        })?;
        r.tmp.path = PathBuf::new();
        std::fs::rename(&record.path, dir.join(format!("{n}.json"))).map_err(stored)?;
        record.path = PathBuf::new();
        Ok(info)
    }

    /// The parts uploaded so far, by number.
    pub fn parts(&self, dir: &std::path::Path) -> Result<BTreeMap<i32, (PartInfo, SystemTime)>, StoreError> {
        let mut out = BTreeMap::new();
        for e in std::fs::read_dir(dir).map_err(io("listing parts"))?.flatten() {
            let name = e.file_name();
            let Some(n) = name.to_str().and_then(|s| s.strip_suffix(".json")).and_then(|s| s.parse::<i32>().ok())
            else {
                continue;
            };
            let Ok(raw) = std::fs::read(e.path()) else { continue };
            let Ok(info) = serde_json::from_slice::<PartInfo>(&raw) else { continue };
            let when = e.metadata().and_then(|m| m.modified()).unwrap_or(std::time::UNIX_EPOCH);
            out.insert(n, (info, when));
        }
        Ok(out)
    }

    /// Concatenates the listed parts into the object. `full_crc`: the
    /// client's full-object CRC64NVME, checked before anything is committed.
    pub fn complete_upload(
        &self,
        dir: &std::path::Path,
        up: Upload,
        listed: &[(i32, String)],
        full_crc: Option<&str>,
        cond: &super::WriteCond,
        gone: &std::sync::atomic::AtomicBool,
    ) -> S3Result<ObjectMeta> {
        if listed.is_empty() {
            return Err(s3_error!(MalformedXML, "CompleteMultipartUpload lists no parts"));
        }
        if listed.windows(2).any(|w| w[0].0 >= w[1].0) {
            return Err(s3_error!(InvalidPartOrder, "parts must be listed in ascending order of part number"));
        }
        let have = self.parts(dir).map_err(super::s3::store_error)?;
        let mut md5s = Vec::with_capacity(16 * listed.len());
        let mut crc = 0u64;
        let mut checked = Vec::with_capacity(listed.len());
        for (i, (n, etag)) in listed.iter().enumerate() {
            let Some((info, _)) = have.get(n) else {
                return Err(s3_error!(InvalidPart, "part {n} was not uploaded"));
            };
            checked.push(info);
            if etag.trim_matches('"') != info.etag {
                return Err(s3_error!(InvalidPart, "part {n} has ETag \"{}\", not {etag}", info.etag));
            }
            if i + 1 < listed.len() && info.size < MIN_PART_BYTES {
                return Err(s3_error!(
                    EntityTooSmall,
                    "part {n} is {} bytes; all parts but the last need 5 MiB",
                    info.size
                ));
            }
            md5s.extend(hex::decode(&info.etag).map_err(|_| s3_error!(InvalidPart, "part {n} is damaged"))?);
            crc = if i == 0 { info.crc64 } else { sluice_dataplane::crc64::combine(crc, info.crc64, info.size) };
        }
        let crc_b64 = b64(&crc.to_be_bytes());
        if let Some(want) = full_crc {
            if want != crc_b64 {
                return Err(s3_error!(
                    BadDigest,
                    "x-amz-checksum-crc64nvme {want} does not match the object ({crc_b64})"
                ));
            }
        }
        let mut tmp = self.temp_file().map_err(super::s3::store_error)?;
        let mut out = tmp.file.take().expect("fresh temp file");
        for ((n, _), info) in listed.iter().zip(checked) {
            // The part's file is opened under the lock its upload renames
            // and describes it under, and only if it is still the part
            // checked above: one uploaded again meanwhile (same number,
            // other bytes) would otherwise be copied under the first one's
            // ETag and CRC.
            let mut part = {
                let _g = self.stripe(&format!("{}/{n}", dir.display()));
                let now = std::fs::read(dir.join(format!("{n}.json")))
                    .ok()
                    .and_then(|raw| serde_json::from_slice::<PartInfo>(&raw).ok());
                if now.as_ref() != Some(info) {
                    return Err(s3_error!(InvalidPart, "part {n} was uploaded again while the upload completed"));
                }
                let file = std::fs::File::open(dir.join(n.to_string()))
                    .map_err(|_| s3_error!(InvalidPart, "part {n} disappeared (aborted or expired meanwhile)"))?;
                let st = file.metadata().map_err(|e| super::s3::store_error(io("stat of a part")(e)))?;
                if (info.ino != 0 && st.ino() != info.ino) || st.len() != info.size {
                    return Err(s3_error!(
                        InvalidPart,
                        "part {n}'s bytes are not the ones its ETag describes (a re-upload of it failed); upload it again"
                    ));
                }
                file
            };
            // std::io::copy between files is copy_file_range on Linux.
            std::io::copy(&mut part, &mut out).map_err(|e| super::s3::store_error(io("assembling the object")(e)))?;
        }
        drop(out);
        let mut meta = up.meta;
        meta.etag = format!("{}-{}", hex::encode(s3s::crypto::Md5::checksum(&md5s)), listed.len());
        meta.parts = Some(listed.len() as u32);
        meta.checksums = Checksums { crc64nvme: Some(crc_b64), ..Default::default() };
        let meta =
            self.commit_object_unless(&up.bucket, &up.key, tmp, meta, cond, gone).map_err(super::s3::store_error)?;
        let _ = std::fs::remove_dir_all(dir);
        Ok(meta)
    }

    pub fn abort_upload(&self, dir: &std::path::Path) -> Result<(), StoreError> {
        std::fs::remove_dir_all(dir).map_err(io("removing the upload"))
    }

    /// Uploads in progress for `bucket` (id, upload, started), by key.
    pub fn uploads(&self, bucket: &str) -> Result<Vec<(String, Upload, SystemTime)>, StoreError> {
        self.bucket_dir(bucket)?;
        let mut out = Vec::new();
        for e in std::fs::read_dir(self.uploads_dir()).map_err(io("listing uploads"))?.flatten() {
            let Some(id) = e.file_name().to_str().map(str::to_owned) else { continue };
            let Ok(raw) = std::fs::read(e.path().join("upload.json")) else { continue };
            let Ok(up) = serde_json::from_slice::<Upload>(&raw) else { continue };
            if up.bucket == bucket {
                let when = e.metadata().and_then(|m| m.created().or(m.modified())).unwrap_or(std::time::UNIX_EPOCH);
                out.push((id, up, when));
            }
        }
        out.sort_by(|a, b| (&a.1.key, &a.0).cmp(&(&b.1.key, &b.0)));
        Ok(out)
    }
}

fn crc_from_b64(s: &str) -> Option<u64> {
    use base64::Engine;
    let b = base64::engine::general_purpose::STANDARD.decode(s).ok()?;
    Some(u64::from_be_bytes(b.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    #[test]
    fn combined_crcs_equal_the_crc_of_the_whole() {
        use sluice_dataplane::crc64;
        let a = vec![7u8; 1000];
        let b: Vec<u8> = (0..3000u32).map(|i| (i * 31) as u8).collect();
        let whole = crc64::checksum(&[a.clone(), b.clone()].concat());
        assert_eq!(crc64::combine(crc64::checksum(&a), crc64::checksum(&b), b.len() as u64), whole);
        // Streamed in pieces, as the RDMA path checks, it is the same CRC.
        let mut d = crc64::digest();
        d.update(&a);
        d.update(&b);
        assert_eq!(d.finalize(), whole);
    }
}
