//! `sluice bench`: the Sluice half of `bench/run loaders` on its own, for
//! quick checks. Reads every object of each size class (4 KiB, 1 MiB,
//! 64 MiB) into registered memory with the Rust client, at each
//! concurrency, and prints throughput, latency and CPU per GiB.
//!
//! Objects are `<namespace>/<prefix><size>/obj-NNNNN`; missing ones are
//! uploaded first (through the shim) unless `--no-populate`. CPU comes from
//! `/proc/<pid>/stat` (10 ms ticks): this process (the client), and the shim
//! and agent named in the `pids` file of a `sluice up` directory.
//! `bench/loaders/run.py` drives it with `--step` and samples the CPU of all
//! processes itself, with nanosecond clocks.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context};
use futures::{StreamExt, TryStreamExt};
use serde_json::json;
use sluice_client::{BatchGet, Client, Region};

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Namespace to read (with `sluice up --rdma`, "<namespace>-rdma" is the
    /// same bucket over the RDMA path).
    #[arg(long, default_value = "data")]
    pub namespace: String,
    /// Key prefix: objects are <prefix><size>/obj-NNNNN, size 4KiB, 64KiB, 1MiB or 64MiB.
    #[arg(long, default_value = "bench/")]
    pub prefix: String,
    /// Number of 4 KiB objects (0 skips the size).
    #[arg(long, default_value_t = 2000)]
    pub small: usize,
    /// Number of 64 KiB objects.
    #[arg(long, default_value_t = 1000)]
    pub kib64: usize,
    /// Number of 1 MiB objects.
    #[arg(long, default_value_t = 256)]
    pub medium: usize,
    /// Number of 64 MiB objects.
    #[arg(long, default_value_t = 16)]
    pub large: usize,
    /// Requests in flight (comma-separated: one cell per value).
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    pub concurrency: Vec<usize>,
    /// Runs per cell; the table shows the median.
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
    /// Fail on missing objects instead of uploading them first.
    #[arg(long)]
    pub no_populate: bool,
    /// State directory of `sluice up`, whose `pids` file names the shim and
    /// the agent (their CPU is reported). Default: .sluice when the local
    /// stack's socket is used.
    #[arg(long)]
    pub stack_dir: Option<PathBuf>,
    /// Read with `Client::get_many`: N in flight as two batches of N/2
    /// (one batch answered while the other is sent), into slots of a region
    /// per batch; an object's latency is its batch's.
    #[arg(long)]
    pub batch: bool,
    /// For drivers: before each run print {"event":"ready",...} and wait for
    /// a line on stdin; after it print {"event":"run",...}.
    #[arg(long, hide = true)]
    pub step: bool,
}

/// The size classes: label and bytes.
pub const SIZES: [(&str, u64); 4] = [("4KiB", 4 << 10), ("64KiB", 64 << 10), ("1MiB", 1 << 20), ("64MiB", 64 << 20)];

const GIB: f64 = (1u64 << 30) as f64;

/// Linux reports /proc/<pid>/stat times in USER_HZ, 100 on every architecture
/// Sluice runs on.
const USER_HZ: f64 = 100.0;

/// CPU seconds (user + system, all threads, living and dead) of `pid`
/// ("self" for this process).
fn proc_cpu(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may contain spaces): state is
    // field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    Some((utime + stime) / USER_HZ)
}

/// The shim's and the agent's pids from a `sluice up` directory.
fn stack_pids(dir: &Path) -> (Option<String>, Option<String>) {
    let text = std::fs::read_to_string(dir.join("pids")).unwrap_or_default();
    let find = |name: &str| {
        text.lines().find_map(|l| {
            let (n, p) = l.split_once(' ')?;
            (n == name).then(|| p.trim().to_owned())
        })
    };
    (find("sluice-shim"), find("sluice-agent"))
}

#[derive(Clone, Copy, Default)]
struct Cpu {
    client: f64,
    shim: Option<f64>,
    agent: Option<f64>,
}

fn sample(shim: &Option<String>, agent: &Option<String>) -> Cpu {
    Cpu {
        client: proc_cpu("self").unwrap_or(0.0),
        shim: shim.as_deref().and_then(proc_cpu),
        agent: agent.as_deref().and_then(proc_cpu),
    }
}

fn delta(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    Some(b? - a?)
}

/// Nearest-rank percentile of sorted values.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// A line of the table: the medians of one cell.
struct Row<'a> {
    label: &'a str,
    conc: usize,
    n: usize,
    gib_s: f64,
    objs_s: f64,
    p50: f64,
    p99: f64,
    client_cpu: f64,
    shim_cpu: Option<f64>,
    agent_cpu: Option<f64>,
    path_label: String,
}

/// One timed run of a cell.
struct Run {
    objects: usize,
    bytes: u64,
    secs: f64,
    /// Per-request latencies, sorted, in microseconds.
    lat_us: Vec<f64>,
    cpu: Cpu,
    data_paths: BTreeMap<&'static str, usize>,
    fallbacks: usize,
    fallback_reason: String,
}

impl Run {
    fn gib_s(&self) -> f64 {
        self.bytes as f64 / GIB / self.secs.max(1e-9)
    }
    fn per_gib(&self, cpu: f64) -> f64 {
        cpu / (self.bytes as f64 / GIB).max(1e-12)
    }
    fn json(&self) -> serde_json::Value {
        json!({
            "objects": self.objects, "bytes": self.bytes, "seconds": self.secs,
            "gib_per_s": self.gib_s(), "objects_per_s": self.objects as f64 / self.secs.max(1e-9),
            "p50_ms": percentile(&self.lat_us, 50.0) / 1e3, "p99_ms": percentile(&self.lat_us, 99.0) / 1e3,
            "client_cpu_s": self.cpu.client, "shim_cpu_s": self.cpu.shim, "agent_cpu_s": self.cpu.agent,
            "data_paths": self.data_paths, "fallbacks": self.fallbacks, "fallback_reason": self.fallback_reason,
        })
    }
}

/// Reads every path once, `conc` at a time, each into a free region.
async fn read_all(
    client: &Client,
    paths: &[String],
    regions: &[Region],
    size: u64,
    conc: usize,
) -> anyhow::Result<Run> {
    let free = std::sync::Mutex::new((0..regions.len()).collect::<Vec<usize>>());
    let free = &free;
    let t0 = Instant::now();
    let results: Vec<(f64, &'static str, String)> = futures::stream::iter(paths)
        .map(|path| async move {
            let idx = free.lock().unwrap_or_else(|p| p.into_inner()).pop().context("no free region")?;
            let region = regions.get(idx).context("region index out of range")?;
            let t = Instant::now();
            let res = client.get(path, region, 0, None).await;
            let us = t.elapsed().as_secs_f64() * 1e6;
            free.lock().unwrap_or_else(|p| p.into_inner()).push(idx);
            let got = res.with_context(|| format!("reading {path}"))?;
            if got.bytes != size {
                bail!("{path}: read {} bytes, expected {size} [request {}]", got.bytes, got.request_id);
            }
            Ok((us, got.data_path, got.fallback_reason))
        })
        .buffer_unordered(conc.max(1))
        .try_collect()
        .await?;
    Ok(tally(results, size, t0.elapsed().as_secs_f64()))
}

/// Batches in flight and objects per batch for `--batch` at concurrency `conc`.
fn batch_shape(conc: usize) -> (usize, usize) {
    if conc <= 1 {
        (1, 1)
    } else {
        (2, conc / 2)
    }
}

/// Reads every path once with `get_many`: batches of `per` objects into
/// slots of a free region (one per batch in flight).
async fn read_batched(
    client: &Client,
    paths: &[String],
    regions: &[Region],
    size: u64,
    per: usize,
) -> anyhow::Result<Run> {
    let free = std::sync::Mutex::new((0..regions.len()).collect::<Vec<usize>>());
    let free = &free;
    let t0 = Instant::now();
    let batches: Vec<Vec<(f64, &'static str, String)>> = futures::stream::iter(paths.chunks(per.max(1)))
        .map(|chunk| async move {
            let idx = free.lock().unwrap_or_else(|p| p.into_inner()).pop().context("no free region")?;
            let region = regions.get(idx).context("region index out of range")?;
            let items: Vec<BatchGet> = chunk
                .iter()
                .enumerate()
                .map(|(i, path)| BatchGet {
                    path: path.clone(),
                    region_id: region.id().to_owned(),
                    offset: i as u64 * size,
                    range: None,
                    max_bytes: size,
                    if_match: String::new(),
                })
                .collect();
            let t = Instant::now();
            let res = client.get_many(&items).await;
            let us = t.elapsed().as_secs_f64() * 1e6;
            free.lock().unwrap_or_else(|p| p.into_inner()).push(idx);
            let mut out = Vec::with_capacity(chunk.len());
            for (path, got) in chunk.iter().zip(res.context("a batch failed")?) {
                let got = got.with_context(|| format!("reading {path}"))?;
                if got.bytes != size {
                    bail!("{path}: read {} bytes, expected {size} [request {}]", got.bytes, got.request_id);
                }
                out.push((us, got.data_path, got.fallback_reason));
            }
            Ok(out)
        })
        .buffer_unordered(regions.len().max(1))
        .try_collect()
        .await?;
    Ok(tally(batches.into_iter().flatten().collect(), size, t0.elapsed().as_secs_f64()))
}

/// One run's figures from its per-object (latency µs, data path, fallback reason).
fn tally(results: Vec<(f64, &'static str, String)>, size: u64, secs: f64) -> Run {
    let mut lat_us: Vec<f64> = results.iter().map(|r| r.0).collect();
    lat_us.sort_by(|a, b| a.total_cmp(b));
    let mut data_paths = BTreeMap::new();
    let mut fallbacks = 0;
    let mut fallback_reason = String::new();
    for (_, dp, why) in &results {
        *data_paths.entry(*dp).or_insert(0) += 1;
        if !why.is_empty() {
            fallbacks += 1;
            fallback_reason.clone_from(why);
        }
    }
    Run {
        objects: results.len(),
        bytes: size * results.len() as u64,
        secs,
        lat_us,
        cpu: Cpu::default(),
        data_paths,
        fallbacks,
        fallback_reason,
    }
}

/// Uploads the objects that are missing or have the wrong size.
async fn populate(client: &Client, sets: &[(&str, u64, Vec<String>)]) -> anyhow::Result<usize> {
    let mut missing = Vec::new();
    for (_, size, paths) in sets {
        let sizes: Vec<Option<u64>> = futures::stream::iter(paths)
            .map(|p| async move { client.head(p).await.ok().map(|o| o.size) })
            .buffered(16)
            .collect()
            .await;
        for (p, got) in paths.iter().zip(sizes) {
            if got != Some(*size) {
                missing.push((p.clone(), *size));
            }
        }
    }
    let Some(max) = missing.iter().map(|m| m.1).max() else { return Ok(0) };
    let region = client.register(max).await?;
    let mut buf = vec![0u8; max as usize];
    for (i, (path, size)) in missing.iter().enumerate() {
        let n = *size as usize;
        crate::demo::fill(&mut buf[..n], i as u64 + 1);
        region.write_at(0, &buf[..n])?;
        client.put(path, &region, 0, *size).await.with_context(|| format!("uploading {path}"))?;
    }
    client.release(region).await?;
    Ok(missing.len())
}

fn wait_for_go(ready: serde_json::Value) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{ready}")?;
    out.flush()?;
    let mut line = String::new();
    if std::io::stdin().lock().read_line(&mut line)? == 0 {
        bail!("--step: stdin closed");
    }
    Ok(())
}

pub async fn run(client: &Client, socket: &Path, args: &BenchArgs, json_out: bool) -> anyhow::Result<()> {
    if args.concurrency.is_empty() || args.concurrency.contains(&0) || args.repeats == 0 {
        bail!("--concurrency values and --repeats must be at least 1");
    }
    let counts = [args.small, args.kib64, args.medium, args.large];
    let sets: Vec<(&str, u64, Vec<String>)> = SIZES
        .iter()
        .zip(counts)
        .filter(|(_, n)| *n > 0)
        .map(|((label, size), n)| {
            let paths = (0..n).map(|i| format!("{}/{}{label}/obj-{i:05}", args.namespace, args.prefix)).collect();
            (*label, *size, paths)
        })
        .collect();
    if !args.no_populate {
        let n = populate(client, &sets).await?;
        if n > 0 && !json_out && !args.step {
            eprintln!("uploaded {n} missing object(s)");
        }
    }
    let stack_dir = args.stack_dir.clone().or_else(|| {
        (socket == Path::new(".sluice/run/shim.sock") && Path::new(".sluice/pids").exists())
            .then(|| PathBuf::from(".sluice"))
    });
    let (shim, agent) = stack_dir.as_deref().map(stack_pids).unwrap_or((None, None));

    let mut cells = Vec::new();
    let mut rows = Vec::new();
    for (label, size, paths) in &sets {
        for &conc in &args.concurrency {
            let (streams, per) = if args.batch { batch_shape(conc) } else { (conc.min(paths.len()), 1) };
            let mut regions = Vec::new();
            for _ in 0..streams {
                regions.push(client.register(*size * per as u64).await?);
            }
            let read = |paths| {
                let regions = &regions;
                async move {
                    if args.batch {
                        read_batched(client, paths, regions, *size, per).await
                    } else {
                        read_all(client, paths, regions, *size, conc).await
                    }
                }
            };
            // Warm-up (untimed): open the agent's connections for this concurrency.
            read(&paths[..paths.len().min(2 * conc)]).await?;
            let mut runs = Vec::new();
            for repeat in 0..args.repeats {
                if args.step {
                    wait_for_go(json!({"event": "ready", "size": label, "concurrency": conc, "repeat": repeat}))?;
                }
                let before = sample(&shim, &agent);
                let mut r = read(paths).await?;
                let after = sample(&shim, &agent);
                r.cpu = Cpu {
                    client: after.client - before.client,
                    shim: delta(before.shim, after.shim),
                    agent: delta(before.agent, after.agent),
                };
                if args.step {
                    let mut v = r.json();
                    v["event"] = json!("run");
                    v["size"] = json!(label);
                    v["concurrency"] = json!(conc);
                    v["repeat"] = json!(repeat);
                    println!("{v}");
                }
                runs.push(r);
            }
            for r in regions {
                client.release(r).await?;
            }
            let med = |f: &dyn Fn(&Run) -> f64| median(runs.iter().map(f).collect());
            let med_opt = |f: &dyn Fn(&Run) -> Option<f64>| -> Option<f64> {
                let v: Option<Vec<f64>> = runs.iter().map(f).collect();
                v.map(median)
            };
            let gib_s = med(&|r| r.gib_s());
            let objs_s = med(&|r| r.objects as f64 / r.secs.max(1e-9));
            let p50 = med(&|r| percentile(&r.lat_us, 50.0) / 1e3);
            let p99 = med(&|r| percentile(&r.lat_us, 99.0) / 1e3);
            let client_cpu = med(&|r| r.per_gib(r.cpu.client));
            let shim_cpu = med_opt(&|r| r.cpu.shim.map(|c| r.per_gib(c)));
            let agent_cpu = med_opt(&|r| r.cpu.agent.map(|c| r.per_gib(c)));
            let mut paths_seen: BTreeMap<&str, usize> = BTreeMap::new();
            for r in &runs {
                for (k, v) in &r.data_paths {
                    *paths_seen.entry(k).or_insert(0) += v;
                }
            }
            let fallbacks: usize = runs.iter().map(|r| r.fallbacks).sum();
            let path_label = paths_seen.keys().copied().collect::<Vec<_>>().join("+");
            cells.push(json!({
                "size": label, "object_bytes": size, "objects": paths.len(), "concurrency": conc,
                "median": {"gib_per_s": gib_s, "objects_per_s": objs_s, "p50_ms": p50, "p99_ms": p99,
                           "client_cpu_s_per_gib": client_cpu, "shim_cpu_s_per_gib": shim_cpu,
                           "agent_cpu_s_per_gib": agent_cpu},
                "data_paths": paths_seen, "fallbacks": fallbacks,
                "runs": runs.iter().map(Run::json).collect::<Vec<_>>(),
            }));
            rows.push(Row {
                label,
                conc,
                n: paths.len(),
                gib_s,
                objs_s,
                p50,
                p99,
                client_cpu,
                shim_cpu,
                agent_cpu,
                path_label,
            });
        }
    }

    if args.step {
        println!("{}", json!({"event": "done"}));
        return Ok(());
    }
    if json_out {
        println!(
            "{}",
            json!({"namespace": args.namespace, "repeats": args.repeats, "cpu_source": "/proc/<pid>/stat (10 ms ticks)",
                   "stack_dir": stack_dir, "cells": cells})
        );
        return Ok(());
    }
    let opt = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.4}"));
    println!("sluice bench: namespace {}, median of {} run(s); CPU in s/GiB", args.namespace, args.repeats);
    println!(
        "{:<6} {:>4} {:>7} {:>8} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8}  path",
        "size", "conc", "objects", "GiB/s", "obj/s", "p50 ms", "p99 ms", "client", "shim", "agent"
    );
    for r in rows {
        println!(
            "{:<6} {:>4} {:>7} {:>8.3} {:>9.0} {:>8.3} {:>8.3} {:>8.4} {:>8} {:>8}  {}",
            r.label,
            r.conc,
            r.n,
            r.gib_s,
            r.objs_s,
            r.p50,
            r.p99,
            r.client_cpu,
            opt(r.shim_cpu),
            opt(r.agent_cpu),
            r.path_label
        );
    }
    if shim.is_none() {
        println!("(shim/agent CPU: pass --stack-dir of the `sluice up` directory)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&[3.0], 99.0), 3.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
    }

    #[test]
    fn own_cpu_is_readable() {
        assert!(proc_cpu("self").is_some());
    }
}
