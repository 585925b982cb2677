//! `sluice-shim`: the host shim daemon.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use sluice_shim::config::ShimConfig;

// Several small allocations per request (frames, ids, futures): mimalloc's
// per-thread free lists cost less than glibc's arenas (about 5% of the
// shim's CPU per 4 KiB GET at 16 in flight went to glibc malloc/free).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Sluice host shim: the local socket API that data loaders use. Maps local
/// users to tenants (SO_PEERCRED), manages shared-memory regions, forwards
/// requests to the agent.
///
/// Configuration: a TOML file (see deploy/shim.example.toml).
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Path of the TOML configuration file.
    #[arg(short, long, env = "SLUICE_SHIM_CONFIG")]
    config: PathBuf,
    /// Log as JSON lines.
    #[arg(long)]
    log_json: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    sluice_telemetry::init_logging(args.log_json, "info");
    let cfg = ShimConfig::from_file(&args.config).with_context(|| format!("loading {}", args.config.display()))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cfg.worker_threads)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(serve(cfg))
}

async fn serve(cfg: ShimConfig) -> anyhow::Result<()> {
    sluice_shim::server::run(cfg, sluice_telemetry::shutdown_signal()).await.context("shim failed")?;
    Ok(())
}
