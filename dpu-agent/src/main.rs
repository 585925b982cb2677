//! `sluice-agent`: the Sluice DPU agent daemon.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use sluice_agent::config::AgentConfig;

// Many small allocations per request (headers, signing, frames): mimalloc's
// per-thread free lists cost less than glibc's arenas here.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Sluice agent: tenants, namespaces, SigV4 S3 client and the data plane into
/// host memory. Runs on the BlueField-3 Arm cores, or co-located on the host.
///
/// Configuration: a TOML file (see deploy/agent.example.toml). Logs go to
/// stderr; set RUST_LOG (e.g. RUST_LOG=sluice_agent=debug) to tune them.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Path of the TOML configuration file.
    #[arg(short, long, env = "SLUICE_AGENT_CONFIG")]
    config: PathBuf,
    /// Log as JSON lines (with request ids as fields).
    #[arg(long)]
    log_json: bool,
    /// Check the configuration and exit.
    #[arg(long)]
    check: bool,
    /// Print the Open vSwitch rules (meters and flows) the `[nic]` section
    /// asks for, in ovs-ofctl syntax, and exit without applying them.
    #[arg(long)]
    print_nic_rules: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // tonic reports refused TLS handshakes (a shim's expired or foreign
    // certificate, a plaintext shim) only at debug level: show those.
    sluice_telemetry::init_logging(args.log_json, "info,tonic::transport::server::io_stream=debug");
    let cfg = AgentConfig::from_file(&args.config).with_context(|| format!("loading {}", args.config.display()))?;
    if args.print_nic_rules {
        let rules = sluice_agent::server::nic_rules(&cfg).context("the configuration has no [nic] section")??;
        use std::io::Write as _;
        std::io::stdout().write_all(rules.render().as_bytes())?;
        return Ok(());
    }
    if args.check {
        // The namespaces' CA files too: a bad one would stop the start.
        sluice_agent::s3::store_tls::Pools::from_config(&cfg)?;
        tracing::info!("configuration is valid");
        return Ok(());
    }
    sluice_agent::server::run(cfg, Some(args.config.clone()), sluice_telemetry::shutdown_signal())
        .await
        .context("agent failed")?;
    Ok(())
}
