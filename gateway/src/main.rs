//! `sluice-gateway`: S3 server with an embedded directory store.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use sluice_gateway::{Gateway, GatewayConfig};

/// Sluice storage gateway: an S3 server (SigV4 verified) over a local directory.
///
/// Configuration comes from a TOML file (see deploy/gateway.example.toml);
/// flags override single fields of it.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Path of the TOML configuration file.
    #[arg(short, long, env = "SLUICE_GATEWAY_CONFIG")]
    config: PathBuf,
    /// Override the listen address (port 0 picks a free port).
    #[arg(long)]
    listen: Option<std::net::SocketAddr>,
    /// Override where the bound address is written.
    #[arg(long)]
    addr_file: Option<PathBuf>,
    /// Log as JSON lines instead of human-readable text.
    #[arg(long)]
    log_json: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    sluice_telemetry::init_logging(args.log_json, "info");
    let mut cfg = GatewayConfig::from_file(&args.config)?;
    if let Some(l) = args.listen {
        cfg.listen = l;
    }
    if let Some(f) = args.addr_file {
        cfg.addr_file = Some(f);
    }
    let gw = Gateway::bind(&cfg).await.context("starting the gateway")?;
    gw.serve(sluice_telemetry::shutdown_signal()).await;
    Ok(())
}
