//! `sluice-bench encryption`: GET throughput of 64 MiB objects from an
//! `aes-256-gcm` namespace vs the same objects from a plaintext namespace
//! (both over HTTP through the agent), and raw AES-256-GCM sealing by `ring`
//! on one core. Target: encrypted GET >= 0.8x plaintext GET.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::bail;
use serde_json::json;
use sluice_crypt::{FileKeyProvider, KeyId};
use sluice_tests::{pattern, Options, Stack};

use crate::{median, write_result, GIB};

pub async fn run(objects: usize, size_mib: usize, rounds: usize, out: PathBuf) -> anyhow::Result<()> {
    let size = size_mib << 20;
    let keys = tempfile::tempdir()?;
    let k1 = KeyId::new("bench-1")?;
    FileKeyProvider::create_key(keys.path(), "alpha", &k1)?;
    FileKeyProvider::set_current(keys.path(), "alpha", &k1)?;
    // Agent defaults (8 MiB parts, 8 in flight); "data" encrypts with 1 MiB
    // chunks, "plain" over the same bucket does not.
    let stack = Stack::with(Options {
        s3: String::new(),
        data_ns: "encryption = \"aes-256-gcm\"".into(),
        agent_dataplane: format!("[encryption]\nkey_dir = \"{}\"", keys.path().display()),
        ..Default::default()
    });
    let c = stack.client().await;
    let region = c.register(size as u64).await?;
    for i in 0..objects {
        region.write_at(0, &pattern(size, i as u64 + 10))?;
        c.put(&format!("plain/bench/p-{i}"), &region, 0, size as u64).await?;
        c.put(&format!("data/bench/e-{i}"), &region, 0, size as u64).await?;
    }
    let mut table = Vec::new();
    for (label, path) in [("plaintext GET (http)", "plain/bench/p"), ("encrypted GET (aes-256-gcm)", "data/bench/e")] {
        let mut runs = Vec::new();
        for _ in 0..rounds {
            let t0 = Instant::now();
            for i in 0..objects {
                let t = c.get(&format!("{path}-{i}"), &region, 0, None).await?;
                if t.bytes != size as u64 {
                    bail!("{label}: moved {} bytes", t.bytes);
                }
            }
            runs.push((objects * size) as f64 / GIB / t0.elapsed().as_secs_f64());
        }
        table.push((label, median(runs)));
    }
    if region.as_slice() != pattern(size, objects as u64 - 1 + 10).as_slice() {
        bail!("the benchmark read wrong bytes");
    }
    let raw = median((0..rounds).map(|_| sluice_crypt::aes_gcm_throughput(256 << 20, 1 << 20)).collect());
    let (plain, enc) = (table[0].1, table[1].1);
    println!("GET {objects} x {size_mib} MiB, median of {rounds} rounds");
    println!("{:<30} {:>8} {:>14}", "path", "GiB/s", "vs plaintext");
    for (label, gibs) in &table {
        println!("{label:<30} {gibs:>8.3} {:>13.2}x", gibs / plain);
    }
    println!("{:<30} {raw:>8.3}   (ring, one core, 1 MiB chunks)", "raw AES-256-GCM seal");
    println!("encrypted/plaintext GET ratio: {:.2} (target >= 0.80)", enc / plain);
    let result = json!({
        "benchmark": "encryption",
        "objects": objects, "object_mib": size_mib, "rounds": rounds,
        "gib_s_plaintext_get": plain, "gib_s_encrypted_get": enc, "ratio_encrypted_vs_plaintext": enc / plain,
        "gib_s_raw_aes_gcm_one_core": raw,
    });
    write_result(&out, result)
}
