//! `sluice demo`: the quickstart's main job. Uploads a generated dataset of
//! mixed sizes through the shim, loads every object back into registered
//! memory, verifies each SHA-256, and prints a table.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use futures::{StreamExt, TryStreamExt};
use ring::digest::{digest, SHA256};
use serde_json::json;
use sluice_client::Client;

#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Namespace to write into.
    #[arg(long, default_value = "data")]
    pub namespace: String,
    /// Key prefix for the generated objects.
    #[arg(long, default_value = "quickstart/")]
    pub prefix: String,
    /// Number of objects.
    #[arg(long, default_value_t = 64)]
    pub objects: usize,
    /// Largest object size in MiB.
    #[arg(long, default_value_t = 64)]
    pub max_mib: u64,
    /// Requests in flight while loading.
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// Keep the objects afterwards (default: delete them).
    #[arg(long)]
    pub keep: bool,
}

/// Mixed sizes: small files, odd sizes that straddle part boundaries, and
/// large objects that get split into ranged GETs / multipart uploads.
fn size_of(i: usize, max: u64) -> u64 {
    const PATTERN: [u64; 8] =
        [0, 4 << 10, (100 << 10) + 7, 1 << 20, (7 << 20) + 13, 16 << 20, (33 << 20) + 1, 64 << 20];
    PATTERN[i % PATTERN.len()].min(max)
}

/// Deterministic pseudo-random bytes (xorshift64*), so every object differs.
pub(crate) fn fill(buf: &mut [u8], seed: u64) {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for chunk in buf.chunks_mut(8) {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        let v = x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
}

struct Row {
    phase: &'static str,
    objects: usize,
    bytes: u64,
    secs: f64,
    verified: usize,
}

pub async fn run(client: &Client, args: &DemoArgs, json_out: bool) -> anyhow::Result<()> {
    if args.objects == 0 || args.concurrency == 0 {
        bail!("--objects and --concurrency must be at least 1");
    }
    let max = args.max_mib << 20;
    let client = Arc::new(client);
    let key = |i: usize| format!("{}/{}obj-{i:04}", args.namespace, args.prefix);

    // Upload: generate each object in a registered region, remember its hash.
    let region = client.register(max.max(1)).await?;
    let mut expected = Vec::with_capacity(args.objects);
    let mut buf = vec![0u8; max as usize];
    let t0 = Instant::now();
    let mut up_bytes = 0;
    for i in 0..args.objects {
        let n = size_of(i, max) as usize;
        fill(&mut buf[..n], i as u64 + 1);
        region.write_at(0, &buf[..n])?;
        expected.push((key(i), n as u64, digest(&SHA256, &buf[..n])));
        let t = client.put(&key(i), &region, 0, n as u64).await.with_context(|| format!("uploading {}", key(i)))?;
        up_bytes += t.bytes;
    }
    let up =
        Row { phase: "upload", objects: args.objects, bytes: up_bytes, secs: t0.elapsed().as_secs_f64(), verified: 0 };
    client.release(region).await?;
    drop(buf);

    // Load: list, then read every object into registered memory with
    // `concurrency` regions in flight, verifying each checksum in place.
    let listed = client.list_all(&format!("{}/{}", args.namespace, args.prefix)).await?;
    if listed.len() != args.objects {
        bail!("listed {} objects under {}, expected {}", listed.len(), args.prefix, args.objects);
    }
    let mut regions = Vec::new();
    for _ in 0..args.concurrency {
        regions.push(client.register(max.max(1)).await?);
    }
    let pool = Arc::new(tokio::sync::Mutex::new(regions));
    let t0 = Instant::now();
    let results: Vec<(u64, bool)> = futures::stream::iter(expected.iter().cloned())
        .map(|(path, size, want)| {
            let (client, pool) = (client.clone(), pool.clone());
            async move {
                let region = pool.lock().await.pop().context("region pool empty")?;
                let res = client.get(&path, &region, 0, None).await;
                let ok = match &res {
                    Ok(t) => {
                        t.bytes == size
                            && digest(&SHA256, &region.as_slice()[..size as usize]).as_ref() == want.as_ref()
                    }
                    Err(_) => false,
                };
                pool.lock().await.push(region);
                let t = res.with_context(|| format!("loading {path}"))?;
                if !ok {
                    bail!("{path}: checksum or size mismatch (got {} bytes, want {size})", t.bytes);
                }
                Ok::<_, anyhow::Error>((t.bytes, ok))
            }
        })
        .buffer_unordered(args.concurrency)
        .try_collect()
        .await?;
    let load = Row {
        phase: "load+verify",
        objects: results.len(),
        bytes: results.iter().map(|r| r.0).sum(),
        secs: t0.elapsed().as_secs_f64(),
        verified: results.iter().filter(|r| r.1).count(),
    };
    for r in std::mem::take(&mut *pool.lock().await) {
        client.release(r).await?;
    }
    if !args.keep {
        for (path, _, _) in &expected {
            client.delete(path).await?;
        }
    }

    let gib = |r: &Row| r.bytes as f64 / (1u64 << 30) as f64 / r.secs.max(1e-9);
    if json_out {
        let row = |r: &Row| json!({"phase": r.phase, "objects": r.objects, "bytes": r.bytes, "seconds": r.secs, "gib_per_s": gib(r), "verified": r.verified});
        println!("{}", json!({"rows": [row(&up), row(&load)], "all_verified": load.verified == args.objects}));
    } else {
        println!("{:<12} {:>8} {:>14} {:>9} {:>8} {:>9}", "phase", "objects", "bytes", "seconds", "GiB/s", "verified");
        for r in [&up, &load] {
            let v = if r.phase == "upload" { "-".to_owned() } else { format!("{}/{}", r.verified, r.objects) };
            println!("{:<12} {:>8} {:>14} {:>9.3} {:>8.3} {:>9}", r.phase, r.objects, r.bytes, r.secs, gib(r), v);
        }
    }
    if load.verified != args.objects {
        bail!("only {} of {} objects verified", load.verified, args.objects);
    }
    Ok(())
}
