//! `sluice cp`: a local file or tree to or from a namespace, several
//! objects at once, checksummed, resumable. See [`HELP`].

mod journal;
mod plan;
mod regions;
mod transfer;
mod verify;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use anyhow::{bail, Context};
use futures::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use sluice_client::{Client, Code};

use journal::{Journal, Manifest, ManifestEntry, State, WrittenManifest, MANIFEST_NAME};
use plan::{as_prefix, key_problem, landing, Direction, Landing, Refusal};
use transfer::{Ctx, DownloadItem, Manifests, Outcome, UploadItem};

/// `sluice cp --help`.
pub const HELP: &str = "Copy a local file or directory tree to or from a namespace: several
objects at once, checksummed, resumable.

  sluice cp ./file ns/key          upload a file (to ns/prefix/ or ns: under its name)
  sluice cp -r ./dir ns/prefix/    upload a tree: ./dir/a/b -> ns/prefix/a/b
  sluice cp ns/key ./file          download an object (into ./dir/ if a directory)
  sluice cp -r ns/prefix/ ./dir    download a prefix: ns/prefix/a/b -> ./dir/a/b

Paths: the argument whose first component is one of this tenant's namespaces
is the namespace path, the other one is local. If that namespace is also a
file or directory here, the path is ambiguous and refused: write ./data/x for
the local one. With -r a namespace path is a prefix ('/' is added) and a
directory's contents go under it with the same relative layout (empty
directories are not copied; empty keys ending in '/' become directories).
Refused and named as failures: keys with '..', '.' or empty components,
absolute keys (a leading '/'), symbolic links and other non-regular files in
a tree, local names that are not UTF-8, the reserved name .sluice-cp.json.

Parallel: --jobs objects at once, all of them together holding at most
--memory bytes of registered memory (a job waits for room; regions are
reused from object to object). An upload reads the whole file into a region
and stores it with one PUT, which the agent splits into parallel multipart
parts when it is large; a file larger than --memory waits for all of it and
runs alone. A download reads into a region of at most
max(--memory / --jobs, 64 MiB): larger objects come in windows, each pinned
to the ETag the listing showed, so a file never mixes two versions. It writes
a hidden temp file (.sluice-cp-<hash>.tmp) next to the destination, syncs it
and renames it into place: a destination file is never half-written.

Checksummed: the CRC64NVME of every file is computed from the bytes read from
disk (uploads) or written to it (downloads). An upload recomputes the stored
ETag from the bytes it read (their MD5, or the MD5 of the part MD5s at the
agent's part size) and fails on a difference. cp -r uploads then write
ns/prefix/.sluice-cp.json, a manifest of every object's size, ETag and
CRC64NVME. A download checks each file against a manifest's CRC64NVME, else
against an MD5 ETag, and counts what neither could check as unverified.
Namespaces the agent encrypts have ETags of ciphertext: only manifests are
used there. --no-verify-etag: for stores whose ETags are not MD5s. Where
none of these applies, what the agent checked counts (a whole-object GET
against the CRC64NVME it keeps with each object, or by decryption; a PUT the
store confirmed).

Resumable: each copy keeps a journal (size, mtime, ETag and CRC64NVME of
every object done), rewritten atomically as objects complete, in --state-dir
(default $XDG_STATE_HOME/sluice/cp, else ~/.local/state/sluice/cp), one file
per source and destination. Run the same command again after it stopped: an
upload skips a file whose size and mtime are unchanged and whose object still
has the journal's size and ETag; a download skips a file that still has the
journal's size and mtime, or whose CRC64NVME is the journal's or a
manifest's for the listed ETag. Temp files a stopped run left are replaced or
removed.

Output: a progress bar on a terminal, then one summary line (objects and
bytes copied, skipped, failed, GiB/s, verified), or one JSON object with
--json. Every failure is named; the exit status is non-zero if anything
failed or was refused.";

#[derive(clap::Args, Debug)]
pub struct CpArgs {
    /// Source: a local file or directory, or namespace/key (namespace/prefix with -r).
    pub src: String,
    /// Destination: namespace/key (or namespace/prefix/), or a local path.
    pub dest: String,
    /// Copy a directory tree, or every object under a prefix.
    #[arg(short, long)]
    pub recursive: bool,
    /// Objects copied at once.
    #[arg(short, long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub jobs: u32,
    /// Registered memory all jobs together may hold (e.g. 512MiB, 4GiB;
    /// at most the session's limit).
    #[arg(long, default_value = "1GiB", value_parser = parse_size)]
    pub memory: u64,
    /// Do not compare ETags with the MD5 of the bytes (stores whose ETags
    /// are not MD5s, e.g. with SSE-KMS).
    #[arg(long)]
    pub no_verify_etag: bool,
    /// Where the resume journals are kept.
    #[arg(long, env = "SLUICE_CP_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// Content-Type of the objects uploaded.
    #[arg(long, default_value = "")]
    pub content_type: String,
}

/// `123`, `64KiB`, `512MiB`, `4GiB`, `1TiB` (K, M, G, T and KB... are
/// binary units too).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("{s:?} is not a size (e.g. 512MiB)"))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        u => return Err(format!("unknown unit {u:?} (B, KiB, MiB, GiB, TiB)")),
    };
    let bytes = n.checked_shl(shift).filter(|b| b >> shift == n).ok_or_else(|| format!("{s:?} is too large"))?;
    if bytes < 1 << 20 {
        return Err("--memory must be at least 1MiB".into());
    }
    Ok(bytes)
}

/// Smallest per-job download window.
const MIN_WINDOW: u64 = 64 << 20;

pub async fn run(client: &Client, args: &CpArgs, json: bool) -> anyhow::Result<()> {
    let direction = plan::direction(&args.src, &args.dest, client.namespaces())?;
    let ns = match &direction {
        Direction::Upload { ns, .. } | Direction::Download { ns, .. } => ns.clone(),
    };
    let setup = Setup::new(client, args, json, ns)?;
    let t0 = Instant::now();
    let report = match direction {
        Direction::Upload { src, key, .. } => upload(&setup, &src, &key).await?,
        Direction::Download { key, dest, .. } => download(&setup, &key, &dest).await?,
    };
    report.print(t0.elapsed().as_secs_f64(), json)
}

/// What a run is given: the connection, the arguments, and what follows
/// from the namespace's capabilities.
struct Setup<'c> {
    client: &'c Client,
    args: &'c CpArgs,
    json: bool,
    ns: String,
    state_dir: PathBuf,
    /// `--memory`, at most the session's registration limit.
    memory: u64,
    window: u64,
    etag_off: Option<&'static str>,
    part_bytes: u64,
    max_region: u64,
    max_object: u64,
}

impl<'c> Setup<'c> {
    fn new(client: &'c Client, args: &'c CpArgs, json: bool, ns: String) -> anyhow::Result<Self> {
        let caps = client.capabilities();
        let ns_caps = caps.namespaces.iter().find(|n| n.name == ns).cloned().unwrap_or_default();
        let mut memory = args.memory;
        if caps.max_registered_bytes > 0 {
            memory = memory.min(caps.max_registered_bytes);
        }
        let encrypted = !matches!(ns_caps.encryption().as_str_name(), "ENCRYPTION_NONE" | "ENCRYPTION_UNSPECIFIED");
        let etag_off = if args.no_verify_etag {
            Some("--no-verify-etag")
        } else if encrypted {
            Some("encrypted namespace (ETags are of ciphertext)")
        } else {
            None
        };
        let mut window = (memory / u64::from(args.jobs)).max(MIN_WINDOW).min(memory);
        if caps.max_region_bytes > 0 {
            window = window.min(caps.max_region_bytes);
        }
        Ok(Self {
            client,
            args,
            json,
            ns,
            state_dir: journal::state_dir(args.state_dir.as_deref())?,
            memory,
            window,
            etag_off,
            part_bytes: ns_caps.put_part_bytes,
            max_region: caps.max_region_bytes,
            max_object: ns_caps.max_object_bytes,
        })
    }

    /// The journal of this copy (`remote` -> `local` or back), and the
    /// context of its jobs.
    fn ctx(&self, direction: &str, remote: &str, local: &Path, notes: &mut Vec<String>) -> Ctx<'c> {
        let fresh = State {
            direction: direction.into(),
            tenant: self.client.tenant().into(),
            remote: remote.into(),
            local: local.to_string_lossy().into_owned(),
            ..Default::default()
        };
        let path = journal::journal_path(&self.state_dir, direction, self.client.tenant(), remote, local);
        let (journal, note) = Journal::open(path, fresh);
        notes.extend(note);
        Ctx {
            client: self.client,
            ns: self.ns.clone(),
            regions: regions::Regions::new(self.client, self.memory, self.max_region),
            journal,
            etag_off: self.etag_off,
            part_bytes: self.part_bytes,
            window: self.window,
            max_region: self.max_region,
            max_object: self.max_object,
            content_type: self.args.content_type.clone(),
            remote: HashMap::new(),
            manifests: Manifests::default(),
            notes: Mutex::new(Vec::new()),
        }
    }
}

/// What a run did, for the summary.
struct Report {
    direction: &'static str,
    source: String,
    dest: String,
    journal: PathBuf,
    manifest: Option<String>,
    planned: usize,
    /// Regions registered (reused from object to object).
    regions: usize,
    results: Vec<(String, anyhow::Result<Outcome>)>,
    refused: Vec<Refusal>,
    notes: Vec<String>,
}

impl Report {
    fn print(self, secs: f64, json: bool) -> anyhow::Result<()> {
        let (mut copied, mut bytes, mut skipped, mut skipped_bytes, mut verified) = (0u64, 0u64, 0u64, 0u64, 0u64);
        let mut unverified: BTreeMap<String, u64> = BTreeMap::new();
        let mut failures: Vec<(String, String)> =
            self.refused.iter().map(|r| (r.name.clone(), format!("refused: {}", r.reason))).collect();
        for (name, r) in &self.results {
            match r {
                Ok(Outcome::Copied { bytes: b, verified: v }) => {
                    copied += 1;
                    bytes += b;
                    match v {
                        Ok(_) => verified += 1,
                        Err(why) => *unverified.entry(why.clone()).or_default() += 1,
                    }
                }
                Ok(Outcome::Skipped { bytes: b }) => {
                    skipped += 1;
                    skipped_bytes += b;
                }
                Err(e) => failures.push((name.clone(), format!("{e:#}"))),
            }
        }
        let gibps = if secs > 0.0 { bytes as f64 / (1u64 << 30) as f64 / secs } else { 0.0 };
        for n in &self.notes {
            eprintln!("sluice cp: note: {n}");
        }
        for (name, e) in &failures {
            eprintln!("sluice cp: failed: {name}: {e}");
        }
        if json {
            let failures: Vec<_> = failures.iter().map(|(n, e)| json!({"name": n, "error": e})).collect();
            println!(
                "{}",
                json!({"direction": self.direction, "source": self.source, "dest": self.dest,
                "objects": copied, "bytes": bytes, "skipped": skipped, "skipped_bytes": skipped_bytes,
                "failed": failures.len(), "failures": failures, "planned": self.planned,
                "verified": verified, "unverified": unverified.values().sum::<u64>(), "unverified_reasons": unverified,
                "seconds": secs, "gib_per_s": gibps, "regions": self.regions, "journal": self.journal, "manifest": self.manifest})
            );
        } else {
            let unverified_text = if unverified.is_empty() {
                String::new()
            } else {
                let why: Vec<String> = unverified.iter().map(|(w, n)| format!("{n}: {w}")).collect();
                format!(", {} unverified ({})", unverified.values().sum::<u64>(), why.join("; "))
            };
            eprintln!(
                "{} -> {}: {copied} objects ({}) copied in {secs:.2}s ({gibps:.3} GiB/s), {skipped} skipped ({}) \
                 already there, {} failed; {verified} verified{unverified_text}",
                self.source,
                self.dest,
                human(bytes),
                human(skipped_bytes),
                failures.len()
            );
        }
        if !failures.is_empty() {
            bail!("{} of {} failed or refused (named above)", failures.len(), self.planned + self.refused.len());
        }
        Ok(())
    }
}

fn human(n: u64) -> String {
    const UNITS: [(&str, u64); 4] = [("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    match UNITS.iter().find(|(_, u)| n >= *u) {
        Some((name, u)) => format!("{:.1} {name}", n as f64 / *u as f64),
        None => format!("{n} B"),
    }
}

fn bar(total: u64, objects: usize, json: bool) -> ProgressBar {
    if json {
        return ProgressBar::hidden();
    }
    // Draws only when stderr is a terminal.
    let pb = ProgressBar::new(total);
    pb.set_style(
        ProgressStyle::with_template(
            "{spinner} cp {msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} {elapsed} eta {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    pb.set_message(format!("0/{objects}"));
    pb.enable_steady_tick(std::time::Duration::from_millis(200));
    pb
}

/// Runs `job` over `items`, `jobs` at a time; the journal is written after
/// each completion and the bar moved. Returns each item's name and result.
async fn run_jobs<'c, T, F, Fut>(
    ctx: &'c Ctx<'c>,
    items: &'c [(String, T, u64)],
    jobs: u32,
    json: bool,
    job: F,
) -> Vec<(String, anyhow::Result<Outcome>)>
where
    F: Fn(&'c Ctx<'c>, &'c T) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Outcome>> + 'c,
{
    let total: u64 = items.iter().map(|(_, _, size)| size).sum();
    let pb = bar(total, items.len(), json);
    let done = AtomicU64::new(0);
    let journal_failed = std::sync::atomic::AtomicBool::new(false);
    let (pb, done, journal_failed, job) = (&pb, &done, &journal_failed, &job);
    let results: Vec<_> = futures::stream::iter(items)
        .map(|(name, item, size)| async move {
            let r = job(ctx, item).await;
            if let Err(e) = ctx.journal.flush().await {
                if !journal_failed.swap(true, Ordering::Relaxed) {
                    ctx.note(format!(
                        "writing the journal {}: {e:#} (this run cannot be resumed)",
                        ctx.journal.path().display()
                    ));
                }
            }
            pb.inc(*size);
            pb.set_message(format!("{}/{}", done.fetch_add(1, Ordering::Relaxed) + 1, items.len()));
            (name.clone(), r)
        })
        .buffer_unordered(jobs as usize)
        .collect()
        .await;
    pb.finish_and_clear();
    results
}

/// Every object under `prefix` (key -> size, ETag as listed).
async fn listing(client: &Client, ns: &str, prefix: &str) -> anyhow::Result<Vec<(String, u64, String)>> {
    let path = if prefix.is_empty() { ns.to_owned() } else { format!("{ns}/{prefix}") };
    let objects = client.list_all(&path).await.with_context(|| format!("listing {path}"))?;
    Ok(objects.into_iter().map(|o| (o.key, o.size, o.etag)).collect())
}

async fn upload(setup: &Setup<'_>, src: &Path, key: &str) -> anyhow::Result<Report> {
    let (client, args, ns) = (setup.client, setup.args, setup.ns.as_str());
    let md = std::fs::metadata(src).with_context(|| format!("reading {}", src.display()))?;
    let root = std::path::absolute(src).with_context(|| format!("resolving {}", src.display()))?;
    let mut notes = Vec::new();
    let (items, refused, remote, prefix) = if md.is_dir() {
        anyhow::ensure!(args.recursive, "{} is a directory: use -r to copy the tree under it", src.display());
        let prefix = as_prefix(key);
        if let Some(problem) = key_problem(prefix.trim_end_matches('/')).filter(|_| !prefix.is_empty()) {
            bail!("refused {ns}/{key}: {problem}");
        }
        let (files, mut refused) = plan::walk(src);
        let mut items = Vec::new();
        for f in files {
            let key = format!("{prefix}{}", f.rel);
            match key_problem(&key) {
                Some(problem) => refused.push(Refusal { name: f.path.display().to_string(), reason: problem.into() }),
                None => items.push(UploadItem { path: f.path, key }),
            }
        }
        let remote = listing(client, ns, &prefix).await?;
        (items, refused, remote, Some(prefix))
    } else {
        let mut key = key.to_owned();
        if key.is_empty() || key.ends_with('/') {
            let name = src.file_name().and_then(|n| n.to_str()).context("the source has no UTF-8 file name")?;
            key.push_str(name);
        }
        if let Some(problem) = key_problem(&key) {
            bail!("refused {ns}/{key}: {problem}");
        }
        let remote = match client.head(&format!("{ns}/{key}")).await {
            Ok(o) => vec![(key.clone(), o.size, o.etag)],
            Err(e) if e.code() == Some(Code::NoSuchKey) => Vec::new(),
            Err(e) => return Err(e).context(format!("looking up {ns}/{key}")),
        };
        (vec![UploadItem { path: src.to_owned(), key }], Vec::new(), remote, None)
    };
    let dest = format!("{ns}/{}", prefix.as_deref().unwrap_or(key));
    let mut ctx = setup.ctx("upload", &dest, &root, &mut notes);
    ctx.remote = remote.iter().map(|(k, s, e)| (k.clone(), (*s, verify::norm_etag(e)))).collect();
    let named: Vec<(String, UploadItem, u64)> = items
        .into_iter()
        .map(|i| {
            let size = std::fs::metadata(&i.path).map(|m| m.len()).unwrap_or(0);
            (format!("{} -> {ns}/{}", i.path.display(), i.key), i, size)
        })
        .collect();
    let mut results = run_jobs(&ctx, &named, args.jobs, setup.json, |c, i| transfer::upload(c, i)).await;
    let mut manifest = None;
    if let Some(prefix) = &prefix {
        let key = format!("{prefix}{MANIFEST_NAME}");
        let name = format!("{ns}/{key}");
        match write_manifest(&ctx, prefix, &named, &remote).await {
            Ok(()) => manifest = Some(name),
            Err(e) => results.push((name, Err(e))),
        }
        if let Err(e) = ctx.journal.flush().await {
            ctx.note(format!("writing the journal {}: {e:#}", ctx.journal.path().display()));
        }
    }
    ctx.regions.close().await;
    notes.extend(ctx.notes.into_inner().unwrap_or_else(|p| p.into_inner()));
    Ok(Report {
        direction: "upload",
        regions: ctx.regions.registered(),
        source: src.display().to_string(),
        dest,
        journal: ctx.journal.path().to_owned(),
        manifest,
        planned: named.len(),
        results,
        refused,
        notes,
    })
}

/// Writes `<prefix>.sluice-cp.json`: the objects of this tree that the
/// journal knows (copied now or before, and still listed with that ETag),
/// merged with the entries of the manifest already there whose objects are
/// unchanged. Not written when that is what is there already.
async fn write_manifest(
    ctx: &Ctx<'_>,
    prefix: &str,
    items: &[(String, UploadItem, u64)],
    listed: &[(String, u64, String)],
) -> anyhow::Result<()> {
    let key = format!("{prefix}{MANIFEST_NAME}");
    let listed: HashMap<&str, (u64, String)> =
        listed.iter().map(|(k, s, e)| (k.as_str(), (*s, verify::norm_etag(e)))).collect();
    let existing = match listed.get(key.as_str()) {
        None => None,
        Some((size, etag)) => match ctx.journal.manifest().filter(|w| &w.etag == etag) {
            Some(w) => Some(w.manifest),
            None => match transfer::fetch_manifest(ctx, &key, *size, etag).await {
                Ok(m) => Some(m),
                Err(e) => {
                    ctx.note(format!("replacing the manifest {}/{key}, which could not be read: {e:#}", ctx.ns));
                    None
                }
            },
        },
    };
    let mut objects: BTreeMap<String, ManifestEntry> = existing
        .as_ref()
        .map(|m| {
            m.objects
                .iter()
                .filter(|(rel, e)| {
                    listed.get(format!("{prefix}{rel}").as_str()).is_some_and(|(s, t)| *s == e.size && *t == e.etag)
                })
                .map(|(rel, e)| (rel.clone(), e.clone()))
                .collect()
        })
        .unwrap_or_default();
    for (_, item, _) in items {
        if let Some(e) = ctx.journal.get(&item.key) {
            let rel = item.key[prefix.len()..].to_owned();
            objects.insert(rel, ManifestEntry { size: e.size, etag: e.etag, crc64nvme: e.crc64nvme });
        }
    }
    let manifest = Manifest::new(objects);
    if existing.as_ref() == Some(&manifest) {
        return Ok(());
    }
    let bytes = serde_json::to_vec_pretty(&manifest)?;
    let etag = transfer::store_bytes(ctx, &key, &bytes).await.context("storing the manifest")?;
    ctx.journal.set_manifest(WrittenManifest { etag, manifest });
    Ok(())
}

async fn download(setup: &Setup<'_>, key: &str, dest: &Path) -> anyhow::Result<Report> {
    let (client, args, ns) = (setup.client, setup.args, setup.ns.as_str());
    let mut notes = Vec::new();
    let mut refused = Vec::new();
    let mut items = Vec::new();
    let mut manifests = Vec::new();
    let remote = if args.recursive {
        let prefix = as_prefix(key);
        for (k, size, etag) in listing(client, ns, &prefix).await? {
            let landed = landing(&k[prefix.len()..], size).and_then(|l| match &l {
                Landing::File(rel) | Landing::Dir(rel) => match plan::through_symlink(dest, rel) {
                    Some(link) => {
                        Err(format!("its destination goes through the symbolic link {} (not followed)", link.display()))
                    }
                    None => Ok(l),
                },
                _ => Ok(l),
            });
            match landed {
                Ok(Landing::File(rel)) => items.push(DownloadItem { key: k, size, etag, dest: dest.join(rel) }),
                Ok(Landing::Dir(rel)) => {
                    let d = dest.join(rel);
                    if let Err(e) = std::fs::create_dir_all(&d) {
                        refused.push(Refusal {
                            name: format!("{ns}/{k}"),
                            reason: format!("creating {}: {e}", d.display()),
                        });
                    }
                }
                Ok(Landing::Manifest) => manifests.push((k, size, etag)),
                Ok(Landing::Nothing) => {}
                Err(reason) => refused.push(Refusal { name: format!("{ns}/{k}"), reason }),
            }
        }
        std::fs::create_dir_all(dest).with_context(|| format!("creating {}", dest.display()))?;
        format!("{ns}/{prefix}")
    } else {
        anyhow::ensure!(
            !key.is_empty() && !key.ends_with('/'),
            "{ns}/{key} is a prefix: use -r to copy what is under it"
        );
        let o = match client.head(&format!("{ns}/{key}")).await {
            Ok(o) => o,
            Err(e) if e.code() == Some(Code::NoSuchKey) => {
                let page = client.list_page(&format!("{ns}/{key}/"), "", 1, "").await;
                if page.is_ok_and(|p| !p.objects.is_empty()) {
                    bail!("{ns}/{key} is not an object but a prefix: use -r to copy what is under it");
                }
                return Err(e).context(format!("{ns}/{key}"));
            }
            Err(e) => return Err(e).context(format!("looking up {ns}/{key}")),
        };
        let name = key.rsplit('/').next().unwrap_or(key);
        let into_dir = args.dest.ends_with('/') || dest.is_dir();
        if into_dir {
            if let Some(problem) = key_problem(name) {
                bail!("refused {ns}/{key}: its name has {problem}; name the destination file");
            }
        }
        let file = if into_dir { dest.join(name) } else { dest.to_owned() };
        items.push(DownloadItem { key: key.to_owned(), size: o.size, etag: o.etag, dest: file });
        manifests = ancestor_manifests(client, ns, key).await;
        format!("{ns}/{key}")
    };
    let local = std::path::absolute(dest).with_context(|| format!("resolving {}", dest.display()))?;
    let mut ctx = setup.ctx("download", &remote, &local, &mut notes);
    ctx.manifests = Manifests::new(manifests);
    let named: Vec<(String, DownloadItem, u64)> =
        items.into_iter().map(|i| (format!("{ns}/{} -> {}", i.key, i.dest.display()), i.clone(), i.size)).collect();
    let results = run_jobs(&ctx, &named, args.jobs, setup.json, |c, i| transfer::download(c, i)).await;
    ctx.regions.close().await;
    notes.extend(ctx.notes.into_inner().unwrap_or_else(|p| p.into_inner()));
    Ok(Report {
        direction: "download",
        regions: ctx.regions.registered(),
        source: remote,
        dest: dest.display().to_string(),
        journal: ctx.journal.path().to_owned(),
        manifest: None,
        planned: named.len(),
        results,
        refused,
        notes,
    })
}

/// The manifests `cp -r` uploads left in the prefixes above `key` (one
/// HEAD each, at once), as a listing would show them.
async fn ancestor_manifests(client: &Client, ns: &str, key: &str) -> Vec<(String, u64, String)> {
    let dirs: Vec<&str> = key.match_indices('/').map(|(i, _)| &key[..=i]).chain([""]).collect();
    let heads = dirs.iter().map(|d| async move {
        let k = format!("{d}{MANIFEST_NAME}");
        client.head(&format!("{ns}/{k}")).await.ok().map(|o| (k, o.size, o.etag))
    });
    futures::future::join_all(heads).await.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("512mib"), Ok(512 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
        assert!(parse_size("1KiB").is_err(), "below 1 MiB");
        assert!(parse_size("12XB").is_err());
        assert!(parse_size("x").is_err());
        assert!(parse_size("99999999999TiB").is_err());
    }
}
