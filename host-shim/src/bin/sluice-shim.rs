//! `sluice-shim`: the host shim daemon.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use sluice_shim::config::ShimConfig;

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
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colours only on a terminal: log files and journald get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let b = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    if args.log_json {
        b.json().init();
    } else {
        b.init();
    }
    let cfg = ShimConfig::from_file(&args.config).with_context(|| format!("loading {}", args.config.display()))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cfg.worker_threads)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(serve(cfg))
}

async fn serve(cfg: ShimConfig) -> anyhow::Result<()> {
    sluice_shim::server::run(cfg, async {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut t) => {
                tokio::select! { _ = t.recv() => {}, _ = tokio::signal::ctrl_c() => {} }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    })
    .await
    .context("shim failed")?;
    Ok(())
}
