//! `sluice`: command-line client for the host shim, and the local-stack
//! launcher used by the quickstart.

#![forbid(unsafe_code)]

mod bench;
mod caps;
mod certs;
mod cp;
mod demo;
mod doctor;
mod gpu;
mod gpu_doctor;
mod ops;
mod stack;

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use sluice_client::{Client, GpuOptions};

/// Sluice: S3 objects straight into registered memory, through the host shim.
///
/// Paths are "namespace/key" (e.g. data/train/shard-0001). The shim socket is
/// taken from --socket, then $SLUICE_SOCKET, then ./.sluice/run/shim.sock if a
/// local stack is up, then /run/sluice/shim.sock.
#[derive(Parser, Debug)]
#[command(name = "sluice", version, propagate_version = true)]
struct Cli {
    /// Shim socket to connect to.
    #[arg(long, global = true, env = "SLUICE_SOCKET")]
    socket: Option<PathBuf>,
    /// Print machine-readable JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
    /// Deadline of each request (e.g. 30s, 5m); the shim and agent stop a
    /// request when it passes. Default: 5m.
    #[arg(long, global = true, value_parser = humantime::parse_duration)]
    request_timeout: Option<std::time::Duration>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Download an object (or a byte range of it) to a file or stdout; with
    /// --gpu, into GPU memory.
    Get {
        /// namespace/key
        path: String,
        /// Destination file ("-" for stdout). Default: the key's last
        /// component. With --gpu: where to save the bytes copied back from
        /// the GPU (none: they stay on the GPU only).
        dest: Option<PathBuf>,
        /// Read into a buffer on CUDA device N (through pinned staging and
        /// the GPU's copy engines); prints bytes, GiB/s and copies.
        #[arg(long, value_name = "N")]
        gpu: Option<u32>,
        /// With --gpu and a file: compare the bytes copied back from the GPU
        /// with the file instead of writing it.
        #[arg(long, requires = "gpu", requires = "dest")]
        verify: bool,
        /// Byte range: START-END (inclusive) or START-.
        #[arg(long)]
        range: Option<String>,
        /// Shared memory the download uses, in bytes: larger objects come
        /// in windows of this size, each checked to be the same version.
        #[arg(long, default_value_t = 256 << 20, value_parser = clap::value_parser!(u64).range(4096..))]
        window: u64,
    },
    /// Upload a file as an object (multipart above the agent's threshold).
    Put {
        /// Source file.
        src: PathBuf,
        /// Copy the file into a buffer on CUDA device N first and store the
        /// object from GPU memory.
        #[arg(long, value_name = "N")]
        gpu: Option<u32>,
        /// namespace/key
        path: String,
        /// Content-Type to store.
        #[arg(long, default_value = "")]
        content_type: String,
    },
    /// List objects under namespace[/prefix].
    Ls {
        /// namespace or namespace/prefix
        path: String,
        /// Group keys by this delimiter (e.g. "/") instead of listing recursively.
        #[arg(short, long, default_value = "")]
        delimiter: String,
    },
    /// Copy a local file or directory tree to or from a namespace: several
    /// objects at once, checksummed, resumable.
    #[command(long_about = cp::HELP)]
    Cp(cp::CpArgs),
    /// Delete an object.
    Rm {
        /// namespace/key
        path: String,
    },
    /// Show an object's size, ETag and modification time; with --caps,
    /// what this connection can do (region memory, and per namespace the
    /// access, data path, transport, placement, encryption and limits).
    Stat {
        /// namespace/key (with --caps: a namespace, or nothing for all)
        #[arg(required_unless_present = "caps")]
        path: Option<String>,
        /// Show the capabilities the shim and agent agreed at the handshake.
        #[arg(long)]
        caps: bool,
    },
    /// Show this connection's tenant, namespaces and the session counters.
    Whoami,
    /// Start a local stack (gateway + embedded store, agent, shim) in --dir.
    Up(stack::UpArgs),
    /// Restart one daemon of the local stack (gateway, agent or shim) from
    /// its config; the others keep serving.
    Restart(stack::RestartArgs),
    /// Check this node end to end (shim, tenant, agent, each namespace's
    /// store and data path) and say what to fix.
    Doctor(doctor::DoctorArgs),
    /// Issue a private CA and the certificates of the shim↔agent control
    /// channel (mutual TLS), for an agent on a BlueField or another host.
    Certs(certs::CertsArgs),
    /// Stop the local stack started by `sluice up`.
    Down {
        /// State directory used by `sluice up`.
        #[arg(long, default_value = ".sluice")]
        dir: PathBuf,
    },
    /// Upload a generated dataset, load it back into registered memory,
    /// verify every checksum and print a throughput table.
    Demo(demo::DemoArgs),
    /// Read objects of 4 KiB, 1 MiB and 64 MiB into registered memory at
    /// each concurrency and print throughput, latency and CPU per GiB (the
    /// Sluice half of `bench/run loaders`).
    Bench(bench::BenchArgs),
}

fn socket_path(cli: &Cli) -> PathBuf {
    if let Some(s) = &cli.socket {
        return s.clone();
    }
    let local = PathBuf::from(".sluice/run/shim.sock");
    if local.exists() {
        return local;
    }
    PathBuf::from("/run/sluice/shim.sock")
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();

    match &cli.cmd {
        Cmd::Up(args) => return stack::up(args, cli.json).await,
        Cmd::Down { dir } => return stack::down(dir),
        Cmd::Restart(args) => return stack::restart(args),
        Cmd::Certs(args) => return certs::run(args, cli.json),
        Cmd::Doctor(args) => return doctor::run(&socket_path(&cli), args, cli.json).await,
        _ => {}
    }
    let socket = socket_path(&cli);
    // `--gpu`: the CUDA driver first (without it, say so before anything else).
    let cuda = match &cli.cmd {
        Cmd::Get { gpu: Some(_), .. } | Cmd::Put { gpu: Some(_), .. } => Some(gpu::cuda_for_gpu_flag()?),
        _ => None,
    };
    let gpu_options = GpuOptions { cuda: cuda.clone(), ..Default::default() };
    let client = Client::connect_with(&socket, gpu_options).await.with_context(|| {
        format!(
            "is the shim running? (start a local stack with `sluice up`, or pass --socket)\nsocket: {}",
            socket.display()
        )
    })?;
    if let Some(t) = cli.request_timeout {
        client.set_timeout(Some(t));
    }
    match (cli.cmd, cuda) {
        (Cmd::Get { path, dest, range, gpu: Some(device), verify, .. }, Some(cuda)) => {
            let args = gpu::GetArgs { device, path: &path, file: dest.as_deref(), range: range.as_deref(), verify };
            gpu::get(&client, &cuda, args, cli.json).await
        }
        (Cmd::Put { src, path, content_type, gpu: Some(device) }, Some(cuda)) => {
            gpu::put(&client, &cuda, device, &src, &path, &content_type, cli.json).await
        }
        (cmd, _) => run(&client, &socket, cmd, cli.json).await,
    }
}

/// The commands that need a shim connection (and no GPU).
async fn run(client: &Client, socket: &std::path::Path, cmd: Cmd, json: bool) -> anyhow::Result<()> {
    match cmd {
        Cmd::Get { path, dest, range, window, .. } => {
            ops::get(client, &path, dest, range.as_deref(), window, json).await
        }
        Cmd::Put { src, path, content_type, .. } => ops::put(client, &src, &path, &content_type, json).await,
        Cmd::Ls { path, delimiter } => ops::ls(client, &path, &delimiter, json).await,
        Cmd::Rm { path } => ops::rm(client, &path, json).await,
        Cmd::Cp(args) => cp::run(client, &args, json).await,
        Cmd::Stat { path, caps: true } => {
            let ns = path.as_deref().map(|p| p.split('/').next().unwrap_or(p));
            if let Some(ns) = ns.filter(|ns| !client.namespaces().iter().any(|n| n == ns)) {
                anyhow::bail!("namespace {ns:?} is not one of this tenant's: {}", client.namespaces().join(", "));
            }
            let c = client.capabilities();
            if json {
                println!("{}", caps::to_json(c, ns));
            } else {
                print!("{}", caps::to_text(c, ns));
            }
            Ok(())
        }
        Cmd::Stat { path, caps: false } => ops::stat(client, path.as_deref().unwrap_or_default(), json).await,
        Cmd::Whoami => ops::whoami(client, json).await,
        Cmd::Demo(args) => demo::run(client, &args, json).await,
        Cmd::Bench(args) => bench::run(client, socket, &args, json).await,
        Cmd::Up(_) | Cmd::Down { .. } | Cmd::Restart(_) | Cmd::Certs(_) | Cmd::Doctor(_) => Ok(()),
    }
}
