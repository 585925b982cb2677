//! `sluice-bench`: end-to-end benchmarks that compare against a ceiling or
//! peers in the same run and print ratios.
//!
//! `sluice-bench rdma-path`: GET throughput of 64 MiB objects through
//! shim -> agent -> gateway over (a) the RDMA path with the `tcp` transport,
//! (b) the HTTP path, and (c) a raw TCP loopback copy of the same bytes (the
//! ceiling on this machine).
//!
//! `sluice-bench encryption`: encrypted vs plaintext GET, and raw
//! AES-256-GCM on one core (see `encryption.rs`).

#![forbid(unsafe_code)]

mod encryption;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use serde_json::json;
use sluice_tests::{pattern, Options, Stack};

#[derive(Parser)]
#[command(version, about = "Sluice end-to-end benchmarks (ratios against a ceiling in the same run)")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// GET throughput: RDMA path (tcp transport) vs HTTP path vs raw TCP.
    RdmaPath {
        /// Objects per round.
        #[arg(long, default_value_t = 8)]
        objects: usize,
        /// Object size in MiB.
        #[arg(long, default_value_t = 64)]
        size_mib: usize,
        /// Rounds per reader; the median is reported.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Where to write the JSON result.
        #[arg(long, default_value = "bench/results/rdma-path.json")]
        out: PathBuf,
    },
    /// GET throughput with and without inline encryption, and raw AES-GCM.
    Encryption {
        /// Objects per round.
        #[arg(long, default_value_t = 4)]
        objects: usize,
        /// Object size in MiB.
        #[arg(long, default_value_t = 64)]
        size_mib: usize,
        /// Rounds per reader; the median is reported.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Where to write the JSON result.
        #[arg(long, default_value = "bench/results/encryption.json")]
        out: PathBuf,
    },
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

pub(crate) const GIB: f64 = (1u64 << 30) as f64;

/// The ceiling: TCP on loopback moving the same bytes from one memory buffer
/// into another, over `streams` connections in parallel (each moves its
/// share of every object).
fn raw_tcp_parallel(objects: usize, size: usize, streams: usize) -> anyhow::Result<f64> {
    let share = size / streams;
    let t0 = Instant::now();
    let handles: Vec<_> = (0..streams).map(|_| std::thread::spawn(move || raw_tcp(objects, share))).collect();
    for h in handles {
        h.join().map_err(|_| anyhow::anyhow!("stream panicked"))??;
    }
    Ok((objects * share * streams) as f64 / GIB / t0.elapsed().as_secs_f64())
}

/// The ceiling: one TCP stream on loopback moving the same bytes from one
/// memory buffer into another.
fn raw_tcp(objects: usize, size: usize) -> anyhow::Result<f64> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let src = pattern(size, 1);
    let sender = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut s, _) = listener.accept()?;
        s.set_nodelay(true)?;
        for _ in 0..objects {
            s.write_all(&src)?;
        }
        Ok(())
    });
    let mut c = TcpStream::connect(addr)?;
    let mut dst = vec![0u8; size];
    let t0 = Instant::now();
    for _ in 0..objects {
        c.read_exact(&mut dst)?;
    }
    let secs = t0.elapsed().as_secs_f64();
    sender.join().map_err(|_| anyhow::anyhow!("sender panicked"))??;
    Ok((objects * size) as f64 / GIB / secs)
}

async fn rdma_path(objects: usize, size_mib: usize, rounds: usize, out: PathBuf) -> anyhow::Result<()> {
    let size = size_mib << 20;
    // Agent defaults (8 MiB ranged parts, 8 in flight); namespace "data"
    // uses RDMA over the tcp transport, "plain" the HTTP body.
    let stack =
        Stack::with(Options { s3: String::new(), data_ns: "data_path = \"rdma\"".into(), ..Default::default() });
    let c = stack.client().await;
    let region = c.register(size as u64).await?;
    for i in 0..objects {
        region.write_at(0, &pattern(size, i as u64 + 10))?;
        c.put(&format!("plain/bench/obj-{i}"), &region, 0, size as u64).await?;
    }
    let mut table = Vec::new();
    for (label, ns, want) in [("rdma (tcp transport)", "data", "rdma"), ("http", "plain", "http")] {
        let mut runs = Vec::new();
        for _ in 0..rounds {
            let t0 = Instant::now();
            for i in 0..objects {
                let t = c.get(&format!("{ns}/bench/obj-{i}"), &region, 0, None).await?;
                if t.bytes != size as u64 || t.data_path != want {
                    bail!("{label}: moved {} bytes via {} ({})", t.bytes, t.data_path, t.fallback_reason);
                }
            }
            runs.push((objects * size) as f64 / GIB / t0.elapsed().as_secs_f64());
        }
        table.push((label, median(runs)));
    }
    // Spot-check the last object's bytes.
    if region.as_slice() != pattern(size, objects as u64 - 1 + 10).as_slice() {
        bail!("the benchmark read wrong bytes");
    }
    let raw = median((0..rounds).map(|_| raw_tcp(objects, size)).collect::<anyhow::Result<Vec<_>>>()?);
    table.push(("raw TCP loopback (ceiling)", raw));
    // The agent moves a GET as 8 parallel ranged parts; the same parallelism
    // on raw TCP, for reference.
    let raw8 = median((0..rounds).map(|_| raw_tcp_parallel(objects, size, 8)).collect::<anyhow::Result<Vec<_>>>()?);
    table.push(("raw TCP loopback, 8 streams", raw8));

    println!("GET {objects} x {size_mib} MiB, median of {rounds} rounds");
    println!("{:<28} {:>8} {:>12}", "path", "GiB/s", "vs raw TCP");
    for (label, gibs) in &table {
        println!("{label:<28} {gibs:>8.3} {:>11.2}x", gibs / raw);
    }
    let (rdma, http) = (table[0].1, table[1].1);
    let result = json!({
        "benchmark": "rdma-path",
        "objects": objects, "object_mib": size_mib, "rounds": rounds,
        "gib_s_rdma_tcp": rdma, "gib_s_http": http, "gib_s_raw_tcp": raw,
        "ratio_vs_raw_tcp": rdma / raw, "ratio_http_vs_raw_tcp": http / raw, "ratio_rdma_vs_http": rdma / http,
        "gib_s_raw_tcp_8_streams": raw8, "ratio_vs_raw_tcp_8_streams": rdma / raw8,
    });
    write_result(&out, result)
}

/// Writes a benchmark's JSON (with the machine's CPU count) to `out`.
pub(crate) fn write_result(out: &std::path::Path, mut result: serde_json::Value) -> anyhow::Result<()> {
    result["machine"] = json!({"cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)});
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(out, serde_json::to_string_pretty(&result)? + "\n")
        .with_context(|| format!("writing {}", out.display()))?;
    println!("wrote {}", out.display());
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
        Cmd::RdmaPath { objects, size_mib, rounds, out } => rdma_path(objects, size_mib, rounds.max(1), out).await,
        Cmd::Encryption { objects, size_mib, rounds, out } => {
            encryption::run(objects, size_mib, rounds.max(1), out).await
        }
    }
}
