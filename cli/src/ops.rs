//! Object commands: get, put, ls, rm, stat, whoami.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use sluice_client::{Client, Transfer};

/// Transfers larger than this show a progress bar (on a terminal).
const PROGRESS_MIN: u64 = 4 << 20;

fn progress(total: u64, json: bool, what: &str) -> ProgressBar {
    if json || total < PROGRESS_MIN {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(total);
    pb.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    pb.set_message(what.to_owned());
    pb
}

/// Parses `START-END` (inclusive) or `START-` into (start, length).
pub fn parse_range(s: &str) -> anyhow::Result<(u64, Option<u64>)> {
    let (a, b) = s.split_once('-').context("range must look like START-END or START-")?;
    let start: u64 = a.parse().context("range start is not a number")?;
    if b.is_empty() {
        return Ok((start, None));
    }
    let end: u64 = b.parse().context("range end is not a number")?;
    if end < start {
        bail!("range end {end} is before its start {start}");
    }
    Ok((start, Some(end - start + 1)))
}

pub(crate) fn summary(t: &Transfer, secs: f64) -> String {
    let gib = t.bytes as f64 / (1u64 << 30) as f64;
    format!(
        "{} bytes in {:.3}s ({:.2} GiB/s) via {}{} [request {}]",
        t.bytes,
        secs,
        if secs > 0.0 { gib / secs } else { 0.0 },
        t.data_path,
        if t.fallback_reason.is_empty() { String::new() } else { format!(" (fell back: {})", t.fallback_reason) },
        t.request_id
    )
}

pub async fn get(
    client: &Client,
    path: &str,
    dest: Option<PathBuf>,
    range: Option<&str>,
    window: u64,
    json: bool,
) -> anyhow::Result<()> {
    let info = client.head(path).await?;
    let (start, len) = match range {
        Some(r) => parse_range(r)?,
        None => (0, None),
    };
    if start > info.size || (start == info.size && info.size > 0) {
        bail!("range starts at {start}, past the end of the {}-byte object", info.size);
    }
    let total = len.map_or(info.size - start, |l| l.min(info.size - start));
    let dest = dest.unwrap_or_else(|| PathBuf::from(path.rsplit('/').next().unwrap_or("object")));
    let mut out: Box<dyn Write> = if dest == Path::new("-") {
        Box::new(std::io::stdout().lock())
    } else {
        Box::new(std::fs::File::create(&dest).with_context(|| format!("creating {}", dest.display()))?)
    };
    let region = client.register(total.clamp(1, window)).await?;
    let pb = progress(total, json, "get");
    let t0 = Instant::now();
    let mut done = 0u64;
    let mut last: Option<Transfer> = None;
    let copied: anyhow::Result<()> = async {
        while done < total || last.is_none() {
            let n = (total - done).min(region.len());
            let t = if total == 0 {
                client.get(path, &region, 0, None).await?
            } else {
                client.get(path, &region, 0, Some((start + done, Some(n)))).await?
            };
            if t.bytes != n {
                bail!("expected {n} bytes, the agent reported {} [request {}]", t.bytes, t.request_id);
            }
            // Each window is one version (the agent checks its parts); all
            // the windows must be the version HEAD named, or the file would
            // mix two.
            if (!info.etag.is_empty() && t.etag != info.etag) || t.object_size != info.size {
                bail!(
                    "{path} changed during the download (ETag {} and {} bytes at the start, ETag {} and {} bytes \
                     at byte {}); try again [request {}]",
                    info.etag,
                    info.size,
                    t.etag,
                    t.object_size,
                    start + done,
                    t.request_id
                );
            }
            out.write_all(&region.as_slice()[..n as usize]).context("writing the destination")?;
            done += n;
            pb.set_position(done);
            last = Some(t);
        }
        out.flush()?;
        Ok(())
    }
    .await;
    if let Err(e) = copied {
        // A partial or mixed file is worse than none.
        drop(out);
        if dest == Path::new("-") {
            return Err(e.context(format!("downloading {path} (what reached stdout is incomplete)")));
        }
        let _ = std::fs::remove_file(&dest);
        return Err(e.context(format!("downloading {path}; the partial {} was removed", dest.display())));
    }
    pb.finish_and_clear();
    let secs = t0.elapsed().as_secs_f64();
    client.release(region).await?;
    let mut t = last.context("no transfer happened")?;
    t.bytes = total;
    if json {
        println!(
            "{}",
            json!({"path": path, "dest": dest, "bytes": total, "object_size": info.size, "etag": info.etag,
            "data_path": t.data_path, "fallback_reason": t.fallback_reason, "seconds": secs, "request_id": t.request_id})
        );
    } else if dest != Path::new("-") {
        eprintln!("{path} -> {}: {}", dest.display(), summary(&t, secs));
    }
    Ok(())
}

pub async fn put(client: &Client, src: &Path, path: &str, content_type: &str, json: bool) -> anyhow::Result<()> {
    let mut file = std::fs::File::open(src).with_context(|| format!("opening {}", src.display()))?;
    let size = file.metadata()?.len();
    let region = client.register(size.max(1)).await?;
    let pb = progress(size, json, "read");
    let mut buf = vec![0u8; (8 << 20).min(size.max(1) as usize)];
    let mut off = 0u64;
    while off < size {
        let n = file.read(&mut buf).context("reading the source")?;
        if n == 0 {
            bail!("{} shrank while reading it", src.display());
        }
        region.write_at(off, &buf[..n])?;
        off += n as u64;
        pb.set_position(off);
    }
    pb.finish_and_clear();
    let spinner = if json || size < PROGRESS_MIN { ProgressBar::hidden() } else { ProgressBar::new_spinner() };
    spinner.set_message(format!("uploading {size} bytes"));
    spinner.enable_steady_tick(std::time::Duration::from_millis(120));
    let t0 = Instant::now();
    let t = client.put_by_id(path, region.id(), 0, size, content_type).await?;
    let secs = t0.elapsed().as_secs_f64();
    spinner.finish_and_clear();
    client.release(region).await?;
    if json {
        println!(
            "{}",
            json!({"path": path, "src": src, "bytes": t.bytes, "etag": t.etag, "parts": t.parts,
            "data_path": t.data_path, "fallback_reason": t.fallback_reason, "seconds": secs, "request_id": t.request_id})
        );
    } else {
        eprintln!("{} -> {path}: {} in {} part(s), etag {}", src.display(), summary(&t, secs), t.parts, t.etag);
    }
    Ok(())
}

pub async fn ls(client: &Client, path: &str, delimiter: &str, json: bool) -> anyhow::Result<()> {
    let mut token = String::new();
    let mut stdout = std::io::stdout().lock();
    let ns = path.split('/').next().unwrap_or(path);
    loop {
        let page = client.list_page(path, &token, 0, delimiter).await?;
        for p in &page.common_prefixes {
            if json {
                writeln!(stdout, "{}", json!({"prefix": format!("{ns}/{p}")}))?;
            } else {
                writeln!(stdout, "{:>14}  {:24}  {ns}/{p}", "DIR", "")?;
            }
        }
        for o in &page.objects {
            if json {
                writeln!(
                    stdout,
                    "{}",
                    json!({"path": format!("{ns}/{}", o.key), "size": o.size, "etag": o.etag,
                    "last_modified_unix_ms": o.last_modified_unix_ms})
                )?;
            } else {
                writeln!(stdout, "{:>14}  {:24}  {ns}/{}", o.size, fmt_time(o.last_modified_unix_ms), o.key)?;
            }
        }
        if page.next_continuation_token.is_empty() {
            return Ok(());
        }
        token = page.next_continuation_token;
    }
}

fn fmt_time(ms: i64) -> String {
    if ms <= 0 {
        return "-".into();
    }
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms as u64);
    humantime::format_rfc3339_seconds(t).to_string()
}

pub async fn rm(client: &Client, path: &str, json: bool) -> anyhow::Result<()> {
    client.delete(path).await?;
    if json {
        println!("{}", json!({"path": path, "deleted": true}));
    }
    Ok(())
}

pub async fn stat(client: &Client, path: &str, json: bool) -> anyhow::Result<()> {
    let o = client.head(path).await?;
    if json {
        println!(
            "{}",
            json!({"path": path, "size": o.size, "etag": o.etag, "content_type": o.content_type,
            "last_modified_unix_ms": o.last_modified_unix_ms})
        );
    } else {
        println!(
            "path:          {path}\nsize:          {}\netag:          {}\ncontent-type:  {}\nlast-modified: {}",
            o.size,
            o.etag,
            o.content_type,
            fmt_time(o.last_modified_unix_ms)
        );
    }
    Ok(())
}

pub async fn whoami(client: &Client, json: bool) -> anyhow::Result<()> {
    let s = client.stats().await?;
    if json {
        println!(
            "{}",
            json!({"tenant": client.tenant(), "namespaces": client.namespaces(), "requests": s.requests,
            "bytes_read": s.bytes_read, "bytes_written": s.bytes_written, "errors": s.errors, "regions": s.regions})
        );
    } else {
        println!("tenant:      {}\nnamespaces:  {}", client.tenant(), client.namespaces().join(", "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!(parse_range("0-9").unwrap(), (0, Some(10)));
        assert_eq!(parse_range("5-").unwrap(), (5, None));
        assert!(parse_range("9-1").is_err());
        assert!(parse_range("x").is_err());
    }
}
