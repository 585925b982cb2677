//! `sluice up` / `sluice down`: a local stack (gateway with an embedded store,
//! agent, shim) in one state directory, for the quickstart and development.
//!
//! Layout of the directory: `data/` (the store), `run/` (sockets, bound
//! addresses), `logs/`, the three generated config files, `credentials`
//! (kept across restarts so the data stays readable) and `pids`.

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::json;

#[derive(clap::Args, Debug)]
pub struct UpArgs {
    /// State directory: configs, data, sockets, logs.
    #[arg(long, default_value = ".sluice")]
    pub dir: PathBuf,
    /// Directory holding sluice-gateway, sluice-agent and sluice-shim
    /// (default: the directory of this executable).
    #[arg(long)]
    pub bin_dir: Option<PathBuf>,
    /// S3 address of the gateway (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub gateway_listen: SocketAddr,
    /// Prometheus address of the agent (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub metrics_listen: SocketAddr,
    /// Name of the bucket and of the tenant's namespace.
    #[arg(long, default_value = "data")]
    pub namespace: String,
    /// Seconds to wait for each process to come up.
    #[arg(long, default_value_t = 30)]
    pub timeout: u64,
    /// Also configure namespace "<namespace>-rdma": the same bucket read and
    /// written over the RDMA path (`data_path = "rdma"`, software `tcp`
    /// transport), e.g. for `bench/run loaders`.
    #[arg(long)]
    pub rdma: bool,
    /// Also configure namespace "<namespace>-enc": the same bucket under the
    /// prefix "enc/", encrypted by the agent (AES-256-GCM) with a key made
    /// in <dir>/keys (0600) and kept across runs.
    #[arg(long)]
    pub encrypted: bool,
    /// Connect the shim to the agent over TCP with mutual TLS, as on a
    /// BlueField (the agent on 127.0.0.1 here), instead of a Unix socket.
    /// A private CA and the certificates are issued into <dir>/tls (keys
    /// 0600), reused by later runs.
    #[arg(long)]
    pub tcp: bool,
    /// Serve the shim's connections on per-core runtimes in the agent
    /// (`[runtime] per_core = true`: for an agent on cores of its own, as
    /// with `bench/run loaders --split`).
    #[arg(long)]
    pub per_core: bool,
}

const PROCS: [&str; 3] = ["sluice-gateway", "sluice-agent", "sluice-shim"];

#[derive(clap::Args, Debug)]
pub struct RestartArgs {
    /// Which daemon: gateway, agent or shim.
    #[arg(value_parser = ["gateway", "agent", "shim"])]
    pub name: String,
    /// State directory used by `sluice up`.
    #[arg(long, default_value = ".sluice")]
    pub dir: PathBuf,
    /// Seconds to wait for the daemon to stop and to come back.
    #[arg(long, default_value_t = 30)]
    pub timeout: u64,
}

/// Replaces `key = ...` (a top-level line of a generated config) with the
/// address a daemon actually bound, so a restart from the same file comes
/// back where the others expect it.
fn pin_address(config: &Path, key: &str, addr: &str) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(config).with_context(|| format!("reading {}", config.display()))?;
    let prefix = format!("{key} = ");
    let pinned: String = text
        .lines()
        .map(|l| if l.starts_with(&prefix) { format!("{key} = \"{addr}\"\n") } else { format!("{l}\n") })
        .collect();
    write_private(config, &pinned)
}

fn write_pids(dir: &Path, pids: &[(String, i32)]) -> anyhow::Result<()> {
    let text: String = pids.iter().map(|(n, p)| format!("{n} {p}\n")).collect();
    std::fs::write(dir.join("pids"), text).with_context(|| format!("writing {}/pids", dir.display()))
}

/// Stops one daemon (SIGTERM, then SIGKILL after `timeout`).
fn stop(name: &str, pid: i32, timeout: Duration) {
    if !alive(pid) {
        return;
    }
    let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
    let t0 = Instant::now();
    while alive(pid) && t0.elapsed() < timeout {
        // Our own children (when up and down run in one process tree) need reaping.
        let _ = nix::sys::wait::waitpid(Pid::from_raw(pid), Some(nix::sys::wait::WaitPidFlag::WNOHANG));
        std::thread::sleep(Duration::from_millis(50));
    }
    if alive(pid) {
        eprintln!("{name} ({pid}) ignored SIGTERM; killing it");
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
}

/// `sluice restart NAME`: stops one daemon of a `sluice up` stack and starts
/// it again from its config; the others keep running (the shim re-opens
/// its agent sessions and regions by itself; clients of a restarted shim
/// reconnect).
pub fn restart(args: &RestartArgs) -> anyhow::Result<()> {
    let dir = args.dir.canonicalize().with_context(|| format!("no stack in {}", args.dir.display()))?;
    let proc_name = format!("sluice-{}", args.name);
    let mut pids = read_pids(&dir);
    let Some(slot) = pids.iter().position(|(n, _)| *n == proc_name) else {
        bail!("{} is not part of the stack in {} (start it with `sluice up`)", proc_name, dir.display());
    };
    let bin_dir = PathBuf::from(
        std::fs::read_to_string(dir.join("bin-dir")).context("the stack does not record its bin directory")?.trim(),
    );
    let timeout = Duration::from_secs(args.timeout);
    stop(&proc_name, pids[slot].1, timeout);
    let run = dir.join("run");
    let config = dir.join(format!("{}.toml", args.name));
    let (ready_file, socket) = match args.name.as_str() {
        "gateway" => (Some(run.join("gateway.addr")), None),
        "agent" => (Some(run.join("agent.addr")), None),
        _ => (None, Some(run.join("shim.sock"))),
    };
    if let Some(f) = &ready_file {
        let _ = std::fs::remove_file(f);
    }
    let mut child = spawn(&dir, &bin_dir.join(&proc_name), &["--config", &config.to_string_lossy()])?;
    pids[slot].1 = child.id() as i32;
    write_pids(&dir, &pids)?;
    wait_for(&mut child, &dir, &proc_name, timeout, || match (&ready_file, &socket) {
        (Some(f), _) => f.exists(),
        (None, Some(s)) => std::os::unix::net::UnixStream::connect(s).is_ok(),
        (None, None) => true,
    })?;
    eprintln!("restarted {proc_name} (pid {})", child.id());
    Ok(())
}

fn alive(pid: i32) -> bool {
    kill(Pid::from_raw(pid), None).is_ok()
}

fn read_pids(dir: &Path) -> Vec<(String, i32)> {
    std::fs::read_to_string(dir.join("pids"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (name, pid) = l.split_once(' ')?;
            Some((name.to_owned(), pid.trim().parse().ok()?))
        })
        .collect()
}

fn random_hex(n: usize) -> String {
    let mut b = vec![0u8; n];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b);
    hex::encode(b)
}

/// A loopback port free now (the daemon given it binds it a moment later).
fn free_loopback_port() -> anyhow::Result<SocketAddr> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port for an operations endpoint")?;
    Ok(l.local_addr()?)
}

fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(())
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

/// Starts `bin` detached (own process group, so it outlives this command and
/// ignores the terminal's Ctrl-C), logging to `logs/<name>.log`.
fn spawn(dir: &Path, bin: &Path, args: &[&str]) -> anyhow::Result<std::process::Child> {
    let name = bin.file_name().and_then(|n| n.to_str()).unwrap_or("proc");
    let log = std::fs::File::create(dir.join("logs").join(format!("{name}.log")))?;
    Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting {} (build it with `cargo build --release`?)", bin.display()))
}

/// Waits until `ready()` or the process dies or time runs out.
fn wait_for(
    child: &mut std::process::Child,
    dir: &Path,
    name: &str,
    timeout: Duration,
    mut ready: impl FnMut() -> bool,
) -> anyhow::Result<()> {
    let t0 = Instant::now();
    loop {
        if ready() {
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            bail!(
                "{name} exited ({status}) while starting; its log says:\n{}",
                tail(&dir.join("logs").join(format!("{name}.log")))
            );
        }
        if t0.elapsed() > timeout {
            bail!(
                "{name} did not come up within {timeout:?}; its log says:\n{}",
                tail(&dir.join("logs").join(format!("{name}.log")))
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub async fn up(args: &UpArgs, json_out: bool) -> anyhow::Result<()> {
    if read_pids(&args.dir).iter().any(|(_, p)| alive(*p)) {
        bail!(
            "a stack is already running in {} (stop it with `sluice down --dir {}`)",
            args.dir.display(),
            args.dir.display()
        );
    }
    for sub in ["data", "run", "logs"] {
        std::fs::create_dir_all(args.dir.join(sub)).with_context(|| format!("creating {}", args.dir.display()))?;
    }
    std::fs::set_permissions(&args.dir, std::fs::Permissions::from_mode(0o700))?;
    let dir = args.dir.canonicalize()?;
    let run = dir.join("run");
    let shim_sock = run.join("shim.sock");
    if shim_sock.as_os_str().len() > 100 {
        bail!("{} is too long for a Unix socket path; use a shorter --dir", shim_sock.display());
    }
    let bin_dir = match &args.bin_dir {
        Some(b) => b.clone(),
        None => std::env::current_exe()?.parent().context("executable has no directory")?.to_owned(),
    };
    for p in PROCS {
        if !bin_dir.join(p).exists() {
            bail!("{} not found in {} (build with `cargo build --release`, or pass --bin-dir)", p, bin_dir.display());
        }
    }
    let timeout = Duration::from_secs(args.timeout);

    // Credentials persist so that data written earlier stays readable.
    let cred_path = dir.join("credentials");
    let (ak, sk) = match std::fs::read_to_string(&cred_path).ok().and_then(|t| {
        let (a, s) = t.trim().split_once(':')?;
        Some((a.to_owned(), s.to_owned()))
    }) {
        Some(c) => c,
        None => {
            let c = (format!("sluice-{}", random_hex(4)), random_hex(20));
            write_private(&cred_path, &format!("{}:{}\n", c.0, c.1))?;
            c
        }
    };
    let ns = &args.namespace;
    let mut pids = Vec::new();

    // Every daemon's operations endpoint (/metrics, /ready): the gateway's
    // and the shim's on free loopback ports picked here (they write no
    // address file for it), the agent's where --metrics-listen says.
    let (gw_ops, shim_ops) = (free_loopback_port()?, free_loopback_port()?);

    // 1. Gateway with the embedded directory store.
    let gw_addr_file = run.join("gateway.addr");
    let _ = std::fs::remove_file(&gw_addr_file);
    let gw_cfg = dir.join("gateway.toml");
    write_private(&gw_cfg, &format!(
        "# Generated by `sluice up`.\nlisten = \"{}\"\nmetrics_listen = \"{gw_ops}\"\ndata_dir = \"{}\"\nbuckets = [\"{ns}\"]\naddr_file = \"{}\"\n\n[[credentials]]\naccess_key = \"{ak}\"\nsecret_key = \"{sk}\"\n",
        args.gateway_listen, dir.join("data").display(), gw_addr_file.display()))?;
    let mut gw = spawn(&dir, &bin_dir.join("sluice-gateway"), &["--config", &gw_cfg.to_string_lossy()])?;
    pids.push(("sluice-gateway", gw.id()));
    let res = wait_for(&mut gw, &dir, "sluice-gateway", timeout, || gw_addr_file.exists());
    let started = |pids: &[(&str, u32)]| pids.iter().map(|(n, p)| format!("{n} {p}\n")).collect::<String>();
    std::fs::write(dir.join("pids"), started(&pids))?;
    res?;
    let gw_addr = std::fs::read_to_string(&gw_addr_file)?.trim().to_owned();
    // The agent's endpoint is this address: a restarted gateway must bind it again.
    pin_address(&gw_cfg, "listen", &gw_addr)?;
    std::fs::write(dir.join("bin-dir"), format!("{}\n", bin_dir.display()))?;

    // The secret the shim proves to the agent for tenant "default" (both
    // read it from this 0600 file).
    let shim_secret = dir.join("default.shim-secret");
    if !shim_secret.exists() {
        write_private(&shim_secret, &format!("{}\n", random_hex(32)))?;
    }

    // 2. Agent, co-located: gRPC and memory hand-over on Unix sockets.
    let agent_addr_file = run.join("agent.addr");
    let _ = std::fs::remove_file(&agent_addr_file);
    let agent_cfg = dir.join("agent.toml");
    let rdma_namespace = if args.rdma {
        format!(
            "\n[[tenants.namespaces]]\nname = \"{ns}-rdma\"\nendpoints = [\"http://{gw_addr}\"]\nbucket = \"{ns}\"\ncredentials = \"local\"\ndata_path = \"rdma\"\ntransport = \"tcp\"\n"
        )
    } else {
        String::new()
    };
    let enc_namespace = if args.encrypted {
        let keys = dir.join("keys").join("default");
        if !keys.join("current").exists() {
            std::fs::create_dir_all(&keys)?;
            write_private(&keys.join("k1"), &format!("{}\n", random_hex(32)))?;
            write_private(&keys.join("current"), "k1\n")?;
        }
        format!(
            "\n[[tenants.namespaces]]\nname = \"{ns}-enc\"\nendpoints = [\"http://{gw_addr}\"]\nbucket = \"{ns}\"\nprefix = \"enc/\"\ncredentials = \"local\"\nencryption = \"aes-256-gcm\"\n\n[encryption]\nkey_dir = \"{}\"\n",
            dir.join("keys").display()
        )
    } else {
        String::new()
    };
    // --tcp: mutual TLS on a loopback TCP listener, certificates from the
    // same code as `sluice certs`.
    let tls = dir.join("tls");
    let (grpc_listen, tls_table, origins) = if args.tcp {
        let wanted = crate::certs::Wanted {
            agent_names: &["127.0.0.1".to_owned()],
            gateway_names: &[],
            shims: &["default".to_owned()],
            days: 825,
        };
        crate::certs::issue_all(&tls, &wanted)?;
        (
            "grpc_listen = \"127.0.0.1:0\"\n".to_owned(),
            format!(
                "\n[tls]\ncert = \"{t}/agent.crt\"\nkey = \"{t}/agent.key\"\nclient_ca = \"{t}/ca.crt\"\n",
                t = tls.display()
            ),
            "[\"127.0.0.1\"]",
        )
    } else {
        (String::new(), String::new(), "[\"unix\"]")
    };
    let agent_toml = format!(
        "# Generated by `sluice up`.\n{grpc_listen}grpc_socket = \"{run}/agent.sock\"\nmemory_socket = \"{run}/agent-memory.sock\"\nmetrics_listen = \"{}\"\naddr_file = \"{}\"\nstate_dir = \"{state}\"\n\n[credentials.local]\naccess_key = \"{ak}\"\nsecret_key = \"{sk}\"\n\n[[tenants]]\nname = \"default\"\nshim_secret_file = \"{secret}\"\nshim_origins = {origins}\n\n[[tenants.namespaces]]\nname = \"{ns}\"\nendpoints = [\"http://{gw_addr}\"]\nbucket = \"{ns}\"\ncredentials = \"local\"\n",
        args.metrics_listen, agent_addr_file.display(), run = run.display(), secret = shim_secret.display(), state = dir.join("state").display()) + &rdma_namespace + &enc_namespace + &tls_table
        + if args.per_core { "\n[runtime]\nper_core = true\n" } else { "" };
    write_private(&agent_cfg, &agent_toml)?;
    let mut agent = spawn(&dir, &bin_dir.join("sluice-agent"), &["--config", &agent_cfg.to_string_lossy()])?;
    pids.push(("sluice-agent", agent.id()));
    std::fs::write(dir.join("pids"), started(&pids))?;
    wait_for(&mut agent, &dir, "sluice-agent", timeout, || agent_addr_file.exists())?;
    let addrs = std::fs::read_to_string(&agent_addr_file)?;
    let bound = |key: &str| {
        addrs.lines().find_map(|l| l.strip_prefix(key).map(|v| v.trim_matches('"').to_owned())).unwrap_or_default()
    };
    let metrics = bound("metrics = ");
    if !metrics.is_empty() {
        pin_address(&agent_cfg, "metrics_listen", &metrics)?;
    }
    let grpc = bound("grpc = ");
    if args.tcp {
        pin_address(&agent_cfg, "grpc_listen", &grpc)?;
    }
    let agent_link = if args.tcp {
        format!(
            "grpc = \"https://{grpc}\"\ntls = {{ ca = \"{t}/ca.crt\", cert = \"{t}/shim-default.crt\", key = \"{t}/shim-default.key\" }}",
            t = tls.display()
        )
    } else {
        format!("grpc = \"unix:{}/agent.sock\"", run.display())
    };

    // 3. Shim: this user is tenant "default".
    let shim_cfg = dir.join("shim.toml");
    let uid = nix::unistd::getuid().as_raw();
    write_private(&shim_cfg, &format!(
        "# Generated by `sluice up`.\nsocket = \"{}\"\nsocket_mode = 0o600\nmetrics_listen = \"{shim_ops}\"\n\n[agent]\n{agent_link}\nmemory_socket = \"{run}/agent-memory.sock\"\n\n[[callers]]\nuid = {uid}\ntenant = \"default\"\n\n[tenant_secrets]\ndefault = \"{secret}\"\n",
        shim_sock.display(), run = run.display(), secret = shim_secret.display()))?;
    let _ = std::fs::remove_file(&shim_sock);
    let mut shim = spawn(&dir, &bin_dir.join("sluice-shim"), &["--config", &shim_cfg.to_string_lossy()])?;
    pids.push(("sluice-shim", shim.id()));
    std::fs::write(dir.join("pids"), started(&pids))?;
    // The socket file appears at bind(), a moment before listen().
    wait_for(&mut shim, &dir, "sluice-shim", timeout, || std::os::unix::net::UnixStream::connect(&shim_sock).is_ok())?;
    // End to end: the handshake reaches the agent.
    let client = sluice_client::Client::connect(&shim_sock).await.context("connecting to the new shim")?;

    if json_out {
        println!(
            "{}",
            json!({"dir": dir, "socket": shim_sock, "gateway": format!("http://{gw_addr}"), "metrics": format!("http://{metrics}/metrics"),
            "ops": {"gateway": format!("http://{gw_ops}"), "agent": format!("http://{metrics}"), "shim": format!("http://{shim_ops}")},
            "tenant": client.tenant(), "namespaces": client.namespaces()})
        );
    } else {
        println!("Sluice is up in {}", dir.display());
        println!("  gateway (S3)  http://{gw_addr}  bucket {ns}, store {}/data", dir.display());
        println!("  shim          {}", shim_sock.display());
        let ops = [("gateway", gw_ops.to_string()), ("agent", metrics.clone()), ("shim", shim_ops.to_string())];
        for (name, ops) in ops {
            println!("  {name:<13} metrics http://{ops}/metrics  ready http://{ops}/ready");
        }
        println!("  tenant        {} (namespaces: {})", client.tenant(), client.namespaces().join(", "));
        println!(
            "Try: sluice put ./file {ns}/file && sluice ls {ns}    Stop: sluice down --dir {}",
            args.dir.display()
        );
    }
    Ok(())
}

pub fn down(dir: &Path) -> anyhow::Result<()> {
    let pids = read_pids(dir);
    if pids.is_empty() {
        eprintln!("no stack recorded in {}", dir.display());
        return Ok(());
    }
    // Stop in reverse start order: shim, agent, gateway.
    for (name, pid) in pids.iter().rev() {
        stop(name, *pid, Duration::from_secs(10));
    }
    std::fs::remove_file(dir.join("pids"))?;
    eprintln!("stopped the stack in {}", dir.display());
    Ok(())
}
