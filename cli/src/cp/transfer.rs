//! One object of a `sluice cp`: skipped when the journal says it is there
//! already, else read into registered memory and stored (upload), or read
//! into registered memory and written to a temp file renamed into place
//! (download), checksummed on the way.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{bail, ensure, Context};
use sluice_client::{Client, Region};
use tokio::sync::OnceCell;

use super::journal::{Entry, Journal, Manifest};
use super::plan::{mtime_ns, temp_path};
use super::regions::{Lease, Regions};
use super::verify::{crc_hex, crc_of_file, etag_check, etag_of, norm_etag, Etag, EtagCheck, Hasher};

/// What every job of a run shares.
pub struct Ctx<'a> {
    pub client: &'a Client,
    pub ns: String,
    /// Registered memory, reused, within `--memory`.
    pub regions: Regions<'a>,
    pub journal: Journal,
    /// Why ETags are not compared (`--no-verify-etag`, an encrypted
    /// namespace); `None`: they are.
    pub etag_off: Option<&'static str>,
    /// The agent's multipart part size here (how a multipart ETag is made).
    pub part_bytes: u64,
    /// Most bytes one download reads per request (larger objects come in
    /// windows pinned to the listed ETag).
    pub window: u64,
    /// The shim's largest region and the namespace's largest object (0: no
    /// limit).
    pub max_region: u64,
    pub max_object: u64,
    pub content_type: String,
    /// Uploads: the objects under the destination before the run (key ->
    /// size, ETag without quotes).
    pub remote: HashMap<String, (u64, String)>,
    /// Downloads: the manifests under the source prefix.
    pub manifests: Manifests,
    /// Things to tell at the end that are not failures.
    pub notes: Mutex<Vec<String>>,
}

impl Ctx<'_> {
    pub fn note(&self, s: String) {
        self.notes.lock().unwrap_or_else(|p| p.into_inner()).push(s);
    }

    fn path(&self, key: &str) -> String {
        format!("{}/{key}", self.ns)
    }
}

/// How one object went (failures are `Err`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Moved; `verified`: against what, or why it could not be.
    Copied { bytes: u64, verified: Result<&'static str, String> },
    /// Already there (the journal, and the object or file, say so).
    Skipped { bytes: u64 },
}

/// A local file to store as `key` (without the namespace).
#[derive(Debug, Clone)]
pub struct UploadItem {
    pub path: PathBuf,
    pub key: String,
}

/// An object (as listed) to write to `dest`.
#[derive(Debug, Clone)]
pub struct DownloadItem {
    pub key: String,
    pub size: u64,
    /// As listed (the reads are pinned to it).
    pub etag: String,
    pub dest: PathBuf,
}

pub async fn upload(ctx: &Ctx<'_>, item: &UploadItem) -> anyhow::Result<Outcome> {
    let md = std::fs::metadata(&item.path).context("reading its metadata")?;
    ensure!(md.is_file(), "not a regular file");
    let (size, mtime) = (md.len(), mtime_ns(&md));
    if let (Some(e), Some((rsize, retag))) = (ctx.journal.get(&item.key), ctx.remote.get(&item.key)) {
        if e.size == size && e.mtime_ns == mtime && *rsize == size && *retag == e.etag {
            return Ok(Outcome::Skipped { bytes: size });
        }
    }
    if ctx.max_object > 0 && size > ctx.max_object {
        bail!("{size} bytes is more than the largest object namespace {} takes ({})", ctx.ns, ctx.max_object);
    }
    if ctx.max_region > 0 && size > ctx.max_region {
        bail!(
            "{size} bytes is more than the shim's largest region ({}); cp reads a file into one region",
            ctx.max_region
        );
    }
    let lease = ctx.regions.lease(size).await?;
    let done = upload_in(ctx, item, &lease.region, size, mtime).await;
    settle(ctx, lease, &done).await;
    done
}

/// Gives a region back for the next object, or releases it when its
/// request failed (the agent may still be reading or writing it).
async fn settle<T>(ctx: &Ctx<'_>, lease: Lease, done: &anyhow::Result<T>) {
    match done {
        Ok(_) => ctx.regions.give_back(lease).await,
        Err(_) => ctx.regions.discard(lease).await,
    }
}

async fn upload_in(
    ctx: &Ctx<'_>,
    item: &UploadItem,
    region: &Arc<Region>,
    size: u64,
    mtime: i64,
) -> anyhow::Result<Outcome> {
    let crc = {
        let (region, path) = (region.clone(), item.path.clone());
        tokio::task::spawn_blocking(move || read_into(&path, &region, size, mtime)).await??
    };
    let t = ctx.client.put_by_id(&ctx.path(&item.key), region.id(), 0, size, &ctx.content_type).await?;
    ensure!(t.bytes == size, "the agent stored {} of {size} bytes [request {}]", t.bytes, t.request_id);
    let etag = norm_etag(&t.etag);
    let ours = match ctx.etag_off {
        Some(why) => Err(why.to_owned()),
        None => {
            let stored = Etag::parse(&etag);
            match etag_check(&stored, size, ctx.part_bytes) {
                Err(why) => Err(why.to_owned()),
                Ok(check) => {
                    let region = region.clone();
                    let ours = tokio::task::spawn_blocking(move || etag_of(&region.as_slice()[..size as usize], check))
                        .await?;
                    if ours != stored {
                        bail!(
                            "the stored ETag {etag} is not the MD5 of the bytes read ({ours}) [request {}]: the \
                             store holds other bytes, or its ETags are not MD5s (then use --no-verify-etag)",
                            t.request_id
                        );
                    }
                    Ok("etag-md5")
                }
            }
        }
    };
    let verified = or_agent(ours, t.verified);
    ctx.journal.record(&item.key, Entry { size, mtime_ns: mtime, etag, crc64nvme: crc_hex(crc) });
    Ok(Outcome::Copied { bytes: size, verified })
}

/// What the agent checked, where `sluice cp` itself could not: a
/// whole-object GET against the CRC64NVME the agent keeps with each object
/// (or by decryption), a PUT the store confirmed.
fn or_agent(ours: Result<&'static str, String>, agent_verified: bool) -> Result<&'static str, String> {
    match ours {
        Err(_) if agent_verified => Ok("agent"),
        other => other,
    }
}

/// Reads the file into the region in 8 MiB chunks, computing its
/// CRC64NVME; fails if the file changes meanwhile.
fn read_into(path: &Path, region: &Region, size: u64, mtime: i64) -> anyhow::Result<u64> {
    let mut f = std::fs::File::open(path).context("opening it")?;
    let mut h = Hasher::new(None);
    let mut buf = vec![0u8; (8 << 20).min(size.max(1) as usize)];
    let mut off = 0u64;
    while off < size {
        let want = (size - off).min(buf.len() as u64) as usize;
        let n = f.read(&mut buf[..want]).context("reading it")?;
        ensure!(n > 0, "it shrank while it was read ({off} of {size} bytes)");
        h.update(&buf[..n]);
        region.write_at(off, &buf[..n])?;
        off += n as u64;
    }
    let mut probe = [0u8; 1];
    ensure!(f.read(&mut probe)? == 0, "it grew while it was read");
    let md = f.metadata()?;
    ensure!(md.len() == size && mtime_ns(&md) == mtime, "it changed while it was read; run cp again");
    Ok(h.finish().crc)
}

pub async fn download(ctx: &Ctx<'_>, item: &DownloadItem) -> anyhow::Result<Outcome> {
    let temp = temp_path(&item.dest);
    // What a killed run may have left.
    let _ = std::fs::remove_file(&temp);
    let etag = norm_etag(&item.etag);
    let size = item.size;
    let local = std::fs::metadata(&item.dest).ok().filter(|m| m.is_file() && m.len() == size);
    let journaled = ctx.journal.get(&item.key).filter(|e| e.etag == etag && e.size == size);
    if let (Some(m), Some(e)) = (&local, &journaled) {
        if mtime_ns(m) == e.mtime_ns {
            return Ok(Outcome::Skipped { bytes: size });
        }
    }
    let manifest_crc = ctx.manifests.crc(ctx, &item.key, &etag, size).await;
    // A file of the right size whose CRC64NVME is the object's (per the
    // journal or the manifest) is there already: e.g. renamed into place
    // by a run killed before it wrote the journal.
    if let (Some(_), Some(want)) = (&local, journaled.as_ref().map(|e| e.crc64nvme.clone()).or(manifest_crc.clone())) {
        let dest = item.dest.clone();
        let (got, md) = tokio::task::spawn_blocking(move || {
            Ok::<_, std::io::Error>((crc_of_file(&dest)?, std::fs::metadata(&dest)?))
        })
        .await??;
        if crc_hex(got) == want {
            ctx.journal.record(&item.key, Entry { size, mtime_ns: mtime_ns(&md), etag, crc64nvme: want });
            return Ok(Outcome::Skipped { bytes: size });
        }
    }
    // What the bytes are checked against: the manifest's CRC64NVME, else
    // the ETag's MD5.
    let check = match (&manifest_crc, ctx.etag_off) {
        (Some(_), _) => Ok(None),
        (None, Some(why)) => Err(why.to_owned()),
        (None, None) => etag_check(&Etag::parse(&etag), size, ctx.part_bytes).map(Some).map_err(str::to_owned),
    };
    let lease = ctx.regions.lease(size.min(ctx.window)).await?;
    let done = download_in(ctx, item, &lease.region, &temp, check.clone().ok().flatten()).await;
    settle(ctx, lease, &done).await;
    let (sums, written, agent_verified) = match done {
        Ok(d) => d,
        Err(e) => {
            let _ = std::fs::remove_file(&temp);
            return Err(e);
        }
    };
    let verified = match (manifest_crc, check) {
        (Some(want), _) if crc_hex(sums.crc) != want => {
            let _ = std::fs::remove_file(&temp);
            bail!(
                "its CRC64NVME is {}, the manifest says {want}: the bytes read are not the ones uploaded",
                crc_hex(sums.crc)
            );
        }
        (Some(_), _) => Ok("manifest-crc64nvme"),
        (None, Err(why)) => Err(why),
        (None, Ok(_)) => match (sums.etag, Etag::parse(&etag)) {
            (Some(ours), stored) if ours == stored => Ok("etag-md5"),
            (Some(ours), Etag::Md5(_)) => {
                let _ = std::fs::remove_file(&temp);
                bail!(
                    "the MD5 of the bytes read is {ours}, the ETag says {etag}: the bytes are damaged, or the \
                     store's ETags are not MD5s (then use --no-verify-etag)"
                );
            }
            // Parts of another size with the same count: not proof either way.
            (Some(_), _) => Err("multipart ETag of another part size".to_owned()),
            (None, _) => Err("nothing to check against".to_owned()),
        },
    };
    let verified = or_agent(verified, agent_verified);
    if let Err(e) = std::fs::rename(&temp, &item.dest) {
        let _ = std::fs::remove_file(&temp);
        return Err(e).with_context(|| format!("renaming the complete file into place from {}", temp.display()));
    }
    let mtime = std::fs::metadata(&item.dest).map(|m| mtime_ns(&m)).unwrap_or(written);
    ctx.journal.record(&item.key, Entry { size, mtime_ns: mtime, etag, crc64nvme: crc_hex(sums.crc) });
    Ok(Outcome::Copied { bytes: size, verified })
}

/// Reads the object window by window into the region, each window hashed
/// and appended to `temp`, which is synced. Returns the sums, the temp
/// file's mtime, and whether the agent checked the bytes end to end (a
/// whole-object read only).
async fn download_in(
    ctx: &Ctx<'_>,
    item: &DownloadItem,
    region: &Arc<Region>,
    temp: &Path,
    check: Option<EtagCheck>,
) -> anyhow::Result<(super::verify::Sums, i64, bool)> {
    if let Some(dir) = item.dest.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let file = std::fs::File::create(temp).with_context(|| format!("creating {}", temp.display()))?;
    let mut state = (file, Hasher::new(check));
    let path = ctx.path(&item.key);
    // The region may be larger than the window (regions are reused).
    let window = ctx.window.min(region.len()).max(1);
    let (size, whole) = (item.size, item.size <= window);
    let mut done = 0u64;
    let mut agent_verified;
    loop {
        let n = (size - done).min(window);
        let range = if whole { None } else { Some((done, Some(n))) };
        let t = ctx.client.get_pinned(&path, region.id(), 0, range, &item.etag).await?;
        ensure!(
            t.bytes == n && t.object_size == size,
            "expected {n} bytes of a {size}-byte object at byte {done}, the agent read {} of {} [request {}]",
            t.bytes,
            t.object_size,
            t.request_id
        );
        ensure!(
            t.etag.is_empty() || norm_etag(&t.etag) == norm_etag(&item.etag),
            "it changed during the copy (ETag {} listed, {} read) [request {}]",
            item.etag,
            t.etag,
            t.request_id
        );
        agent_verified = whole && t.verified;
        let r = region.clone();
        state = tokio::task::spawn_blocking(move || {
            let (mut f, mut h) = state;
            let data = &r.as_slice()[..n as usize];
            h.update(data);
            f.write_all(data).map(|()| (f, h))
        })
        .await?
        .with_context(|| format!("writing {}", temp.display()))?;
        done += n;
        if done >= size {
            break;
        }
    }
    let (file, hasher) = state;
    let mtime = tokio::task::spawn_blocking(move || {
        file.sync_data()?;
        file.metadata().map(|m| mtime_ns(&m))
    })
    .await?
    .with_context(|| format!("syncing {}", temp.display()))?;
    Ok((hasher.finish(), mtime, agent_verified))
}

/// The manifests `cp -r` uploads left under a download's prefix, each read
/// the first time an object under it needs checking.
#[derive(Default)]
pub struct Manifests {
    /// Deepest prefix first.
    found: Vec<FoundManifest>,
}

struct FoundManifest {
    /// The prefix the manifest's keys are relative to ("" or ending '/').
    dir: String,
    key: String,
    size: u64,
    etag: String,
    read: OnceCell<Option<Manifest>>,
}

/// The largest manifest read (a million entries is ~150 MB).
const MAX_MANIFEST: u64 = 1 << 30;

impl Manifests {
    /// From the manifests' keys, sizes and ETags as listed.
    pub fn new(list: Vec<(String, u64, String)>) -> Self {
        let mut found: Vec<FoundManifest> = list
            .into_iter()
            .map(|(key, size, etag)| {
                let dir = key.rsplit_once('/').map_or(String::new(), |(d, _)| format!("{d}/"));
                FoundManifest { dir, key, size, etag, read: OnceCell::new() }
            })
            .collect();
        found.sort_by_key(|m| std::cmp::Reverse(m.dir.len()));
        Self { found }
    }

    /// The CRC64NVME a manifest records for `key` at this ETag and size.
    pub async fn crc(&self, ctx: &Ctx<'_>, key: &str, etag: &str, size: u64) -> Option<String> {
        for m in &self.found {
            let Some(rel) = key.strip_prefix(&m.dir) else { continue };
            let manifest = m.read.get_or_init(|| async { m.fetch(ctx).await }).await;
            if let Some(e) = manifest.as_ref().and_then(|x| x.objects.get(rel)) {
                if norm_etag(&e.etag) == etag && e.size == size {
                    return Some(e.crc64nvme.clone());
                }
            }
        }
        None
    }
}

impl FoundManifest {
    async fn fetch(&self, ctx: &Ctx<'_>) -> Option<Manifest> {
        match fetch_manifest(ctx, &self.key, self.size, &self.etag).await {
            Ok(m) => Some(m),
            Err(e) => {
                ctx.note(format!("not using the manifest {}: {e:#}", ctx.path(&self.key)));
                None
            }
        }
    }
}

/// Reads and parses a manifest (pinned to its listed ETag).
pub async fn fetch_manifest(ctx: &Ctx<'_>, key: &str, size: u64, etag: &str) -> anyhow::Result<Manifest> {
    ensure!(size <= MAX_MANIFEST, "{size} bytes is larger than a manifest may be");
    let lease = ctx.regions.lease(size).await?;
    let read = ctx.client.get_pinned(&ctx.path(key), lease.region.id(), 0, None, etag).await;
    let read = match read {
        Ok(t) if t.bytes == size => Ok(Manifest::parse(&lease.region.as_slice()[..size as usize])),
        Ok(t) => Err(anyhow::anyhow!("read {} of its {size} bytes [request {}]", t.bytes, t.request_id)),
        Err(e) => Err(e.into()),
    };
    settle(ctx, lease, &read).await;
    read?
}

/// Stores `bytes` as `key` (the manifest); returns its ETag.
pub async fn store_bytes(ctx: &Ctx<'_>, key: &str, bytes: &[u8]) -> anyhow::Result<String> {
    let len = bytes.len() as u64;
    let lease = ctx.regions.lease(len).await?;
    let put = async {
        lease.region.write_at(0, bytes)?;
        let t = ctx.client.put_by_id(&ctx.path(key), lease.region.id(), 0, len, "application/json").await?;
        Ok(norm_etag(&t.etag))
    }
    .await;
    settle(ctx, lease, &put).await;
    put
}
