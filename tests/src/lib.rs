//! Test harness: starts real `sluice-gateway`, `sluice-agent` and
//! `sluice-shim` processes on 127.0.0.1 port 0 and temporary Unix sockets,
//! waits for the addresses they report, and stops them on drop.
//!
//! The binaries must be built first (`cargo build --workspace --bins`;
//! `scripts/test` does it). A missing binary fails the test with that advice.

#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

pub mod ceph;
pub mod moto;
mod proxy;
pub mod stores;
pub use proxy::Proxy;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Directory holding the workspace binaries: next to this executable
/// (target/<profile>/deps/<test> -> target/<profile>; a benchmark binary
/// already lives in target/<profile>). `SLUICE_BIN_DIR` overrides.
pub fn bin_dir() -> PathBuf {
    if let Ok(d) = std::env::var("SLUICE_BIN_DIR") {
        return PathBuf::from(d);
    }
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe.parent().expect("executable has a directory");
    if dir.ends_with("deps") {
        dir.parent().expect("target/<profile>").to_owned()
    } else {
        dir.to_owned()
    }
}

/// Path of a workspace binary; panics with a clear message if not built.
pub fn bin(name: &str) -> PathBuf {
    let p = bin_dir().join(name);
    assert!(p.exists(), "{} is missing: run `cargo build --workspace --bins` first (scripts/test does)", p.display());
    p
}

/// Prints one summary line that survives libtest's output capture (it
/// writes to the process's stdout directly, not through `print!`), so
/// `scripts/test` can add up the counts of the reliability and fuzz tests.
pub fn report(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Access key and secret the test gateway accepts.
pub const ACCESS_KEY: &str = "test-access";
pub const SECRET_KEY: &str = "test-secret-key-0123456789";

/// How to shape the stack.
#[derive(Clone)]
pub struct Options {
    /// `[s3]` section of the agent config.
    pub s3: String,
    /// Credentials the agent signs with (default: the gateway's).
    pub agent_credentials: (String, String),
    /// Endpoints of namespace "data" (default: the gateway). `{gw}` expands
    /// to the gateway address.
    pub endpoints: Vec<String>,
    /// Extra `[[callers]]` rules for the shim, TOML. Default maps this uid to
    /// tenant "alpha".
    pub callers: Option<String>,
    /// Start the embedded gateway (false when testing against another store).
    pub gateway: bool,
    /// Connect the shim to the agent over TCP (the DPU layout) instead of
    /// the agent's Unix socket.
    pub grpc_over_tcp: bool,
    /// The (alpha) shim's `[agent] grpc` address, overriding the above
    /// (e.g. a tenant's own listener).
    pub shim_agent: Option<String>,
    /// Extra settings for namespace "data" (e.g. `data_path = "rdma"`).
    pub data_ns: String,
    /// `[rdma]` section of the gateway config.
    pub gateway_rdma: String,
    /// `[backend]` section of the gateway config (default: its directory).
    pub gateway_backend: String,
    /// `[dataplane]` section of the agent config.
    pub agent_dataplane: String,
    /// `[qos]` section of the agent config (e.g. `global_slots = 2`).
    pub agent_qos: String,
    /// `[failover]` section of the agent config (e.g.
    /// `first_byte_timeout_ms = 1500`), and any tables after it (e.g.
    /// `[uploads]`).
    pub agent_failover: String,
    /// Only alpha's namespace "data": no other namespace (on the first
    /// endpoint alone, or with the gateway's keys) to make `/ready` fail
    /// against another store.
    pub only_data: bool,
    /// Extra settings of tenant "alpha" / "beta" in the agent config
    /// (`shims`, `shim_origins`, limits ...), each line ending in a newline.
    /// They go right before the tenant's `[[tenants.namespaces]]`, so a
    /// `[tenants.limits]` table (after any plain keys) works as well as
    /// `limits = { ... }`.
    pub alpha: String,
    pub beta: String,
    /// Also start a second shim (`Stack::beta_socket`) mapping this user to
    /// tenant "beta", for tests with two tenants.
    pub beta_shim: bool,
    /// Top-level settings and tables for the (alpha) shim config, placed
    /// before its `[agent]` table (e.g. `memory_backend = "doca"` + `[doca]`).
    pub shim_extra: String,
    /// Extra lines of the (alpha) shim's `[limits]` table.
    pub shim_limits: String,
    /// Extra lines of the (alpha) shim's `[agent]` table (e.g.
    /// `coalesce_gets = false`).
    pub shim_agent_extra: String,
    /// Lines of the agent's `[limits]` table (e.g. `session_lease_ms = 1000`).
    pub agent_limits: String,
    /// Top-level settings and tables of the gateway config, placed before
    /// its `[rdma]` table (e.g. `header_timeout_ms`, `[multipart]`).
    pub gateway_extra: String,
    /// Key prefix of alpha's namespace "scoped" in bucket "data".
    pub scoped_prefix: String,
    /// Mutual TLS on the agent's TCP listeners, with certificates `sluice
    /// certs` issues into `<dir>/tls` (agent 127.0.0.1, shims "alpha" and
    /// "beta"); a TCP shim then dials https://. Without it the TCP control
    /// channel is plaintext (`insecure = true` on both sides).
    pub tls: bool,
    /// HTTPS on the gateway, with `gateway.crt`/`.key` that `sluice certs
    /// --gateway-name 127.0.0.1` issues into `<dir>/tls`. The namespaces the
    /// harness writes itself ("scoped", "other") then use https:// and
    /// `ca_file = "tls/ca.crt"`; "data" and "plain" use `endpoints` (give
    /// "data" its `ca_file` with `data_ns`).
    pub gateway_tls: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            s3: "get_part_size = 1048576\nmultipart_threshold = 6291456\nput_part_size = 5242880\nmax_concurrency = 4\nmax_attempts = 3\nretry_base_ms = 10\n".into(),
            agent_credentials: (ACCESS_KEY.into(), SECRET_KEY.into()),
            endpoints: vec!["http://{gw}".into()],
            callers: None,
            gateway: true,
            grpc_over_tcp: false,
            shim_agent: None,
            data_ns: String::new(),
            gateway_rdma: String::new(),
            gateway_backend: String::new(),
            agent_dataplane: String::new(),
            agent_qos: String::new(),
            agent_failover: String::new(),
            only_data: false,
            alpha: String::new(),
            beta: String::new(),
            beta_shim: false,
            shim_extra: String::new(),
            shim_limits: String::new(),
            shim_agent_extra: String::new(),
            agent_limits: String::new(),
            gateway_extra: String::new(),
            scoped_prefix: "tenants/alpha/".into(),
            tls: false,
            gateway_tls: false,
        }
    }
}

/// One of the stack's processes, and how to start it again.
struct Proc {
    name: String,
    binary: &'static str,
    config: PathBuf,
    child: Child,
}

/// Starts a shim (binary `sluice-shim`, log `{name}.log`) and waits until
/// it accepts connections.
/// Issues the stack's TLS certificates with `sluice certs` into `<d>/tls`.
fn issue_certs(d: &Path) {
    sluice_certs(d, &["--agent-name", "127.0.0.1", "--shim", "alpha", "--shim", "beta"]);
}

/// Runs `sluice certs --dir <d>/tls` with `args` (the CA is created once
/// and reused).
fn sluice_certs(d: &Path, args: &[&str]) {
    let out = Command::new(bin("sluice"))
        .args(["certs", "--dir", d.join("tls").to_str().expect("utf8")])
        .args(args)
        .output()
        .expect("run sluice certs");
    assert!(out.status.success(), "sluice certs failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// The lines of a shim's `[agent]` table that reach the agent at `grpc`:
/// plaintext TCP says `insecure`; https:// presents `shim`'s certificate.
pub fn agent_link(grpc: &str, shim: &str) -> String {
    if grpc.starts_with("https://") {
        format!(
            "grpc = \"{grpc}\"\ntls = {{ ca = \"tls/ca.crt\", cert = \"tls/shim-{shim}.crt\", key = \"tls/shim-{shim}.key\" }}"
        )
    } else if grpc.starts_with("http://") {
        format!("grpc = \"{grpc}\"\ninsecure = true")
    } else {
        format!("grpc = \"{grpc}\"")
    }
}

fn start_shim(d: &Path, name: &str, cfg: &Path, socket: &Path) -> Proc {
    let shim = spawn_as(d, "sluice-shim", name, &["--config", cfg.to_str().expect("utf8")]);
    let mut p = Proc { name: name.to_owned(), binary: "sluice-shim", config: cfg.to_owned(), child: shim };
    wait_socket(d, &mut p, socket);
    p
}

fn wait_socket(d: &Path, p: &mut Proc, socket: &Path) {
    let (name, shim) = (p.name.as_str(), &mut p.child);
    let t0 = Instant::now();
    // The socket file appears at bind(), a moment before listen(): wait
    // until a connection is accepted, not just for the file.
    while std::os::unix::net::UnixStream::connect(socket).is_err() {
        if let Ok(Some(s)) = shim.try_wait() {
            panic!(
                "{name} exited with {s}:\n{}",
                std::fs::read_to_string(d.join(format!("{name}.log"))).unwrap_or_default()
            );
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "{name} did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A running stack. Processes are killed when it drops.
pub struct Stack {
    pub dir: tempfile::TempDir,
    pub gateway_addr: Option<SocketAddr>,
    pub metrics_addr: SocketAddr,
    pub socket: PathBuf,
    /// The second shim's socket (tenant "beta"), with `Options::beta_shim`.
    pub beta_socket: PathBuf,
    /// The agent's gRPC address (TCP).
    pub grpc_addr: SocketAddr,
    pub data_dir: PathBuf,
    children: Vec<Proc>,
}

impl Drop for Stack {
    fn drop(&mut self) {
        for p in self.children.iter_mut().rev() {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
        if std::thread::panicking() {
            print_logs_after_failure(self.dir.path());
        }
    }
}

/// For a failed test: the last lines of every `*.log` under `dir` and the
/// free space where the test wrote (the temp dirs are gone afterwards, and
/// a store that ran out of disk looks like any other 5xx from outside).
pub fn print_logs_after_failure(dir: &Path) {
    let mut logs: Vec<PathBuf> = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "log") {
                logs.push(path);
            }
        }
    }
    logs.sort();
    for log in logs {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        eprintln!("---- last lines of {} ----", log.display());
        for line in &lines[lines.len().saturating_sub(40)..] {
            eprintln!("{line}");
        }
    }
    if let Ok(out) = Command::new("df").args(["-h", "/tmp", "/dev/shm"]).arg(dir).output() {
        eprintln!("---- free space ----\n{}", String::from_utf8_lossy(&out.stdout));
    }
}

fn wait_file(path: &Path, child: &mut Child, name: &str, log: &Path) -> String {
    let t0 = Instant::now();
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            if !s.is_empty() {
                return s;
            }
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{name} exited with {status}:\n{}", std::fs::read_to_string(log).unwrap_or_default());
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "{name} did not start:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn spawn(dir: &Path, name: &str, args: &[&str]) -> Child {
    spawn_as(dir, name, name, args)
}

/// Starts binary `name` logging to `{log_name}.log` in `dir` (appending: a
/// restarted process adds to its predecessor's log).
fn spawn_as(dir: &Path, name: &str, log_name: &str, args: &[&str]) -> Child {
    let log =
        std::fs::File::options().create(true).append(true).open(dir.join(format!("{log_name}.log"))).expect("log file");
    Command::new(bin(name))
        .args(args)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("dup log"))
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {name}: {e}"))
}

impl Stack {
    pub fn start() -> Self {
        Self::with(Options::default())
    }

    pub fn with(opts: Options) -> Self {
        // Short paths: Unix socket names are limited to 108 bytes.
        let dir = tempfile::Builder::new().prefix("sl").tempdir_in(std::env::temp_dir()).expect("tempdir");
        let d = dir.path().to_owned();
        let data_dir = d.join("data");
        let mut children = Vec::new();

        let mut gateway_addr: Option<SocketAddr> = None;
        let gateway_tls = if opts.gateway_tls {
            sluice_certs(&d, &["--gateway-name", "127.0.0.1"]);
            "[tls]\ncert = \"tls/gateway.crt\"\nkey = \"tls/gateway.key\"\n"
        } else {
            ""
        };
        if opts.gateway {
            let cfg = d.join("gateway.toml");
            std::fs::write(&cfg, format!(
                "listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\nbuckets = [\"data\", \"other\"]\naddr_file = \"{}/gw.addr\"\n{}\n{gateway_tls}[rdma]\n{}\n{}\n[[credentials]]\naccess_key = \"{ACCESS_KEY}\"\nsecret_key = \"{SECRET_KEY}\"\n",
                data_dir.display(), d.display(), opts.gateway_extra, opts.gateway_rdma, opts.gateway_backend)).expect("write config");
            let mut gw = spawn(&d, "sluice-gateway", &["--config", cfg.to_str().expect("utf8")]);
            let addr = wait_file(&d.join("gw.addr"), &mut gw, "sluice-gateway", &d.join("sluice-gateway.log"));
            // Restarted from the same file, it must come back on the same port.
            pin_address(&cfg, "listen", addr.trim());
            gateway_addr = Some(addr.trim().parse().expect("gateway addr"));
            children.push(Proc { name: "sluice-gateway".into(), binary: "sluice-gateway", config: cfg, child: gw });
        }
        // Without our gateway, the other namespaces point at the first endpoint's host.
        let gw = gateway_addr.map(|a| a.to_string()).unwrap_or_else(|| {
            let first = opts.endpoints.first().map(String::as_str).unwrap_or_default();
            first.trim_start_matches("http://").trim_start_matches("https://").to_owned()
        });
        let endpoints: Vec<String> = opts.endpoints.iter().map(|e| format!("\"{}\"", e.replace("{gw}", &gw))).collect();
        let (ak, sk) = &opts.agent_credentials;
        // Each tenant's shim secret, a 0600 file both the agent and the shim read.
        for t in ["alpha", "beta"] {
            let f = d.join(format!("{t}.shim-secret"));
            std::fs::write(&f, format!("{t}-shim-secret-{}\n", std::process::id())).expect("write shim secret");
            std::fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(0o600)).expect("chmod secret");
        }
        if opts.tls {
            issue_certs(&d);
        }
        let agent_tls = if opts.tls {
            "[tls]\ncert = \"tls/agent.crt\"\nkey = \"tls/agent.key\"\nclient_ca = \"tls/ca.crt\"\n"
        } else {
            "[tls]\ninsecure = true\n"
        };
        let (scheme, store_ca) = if opts.gateway_tls { ("https", "ca_file = \"tls/ca.crt\"\n") } else { ("http", "") };
        let cfg = d.join("agent.toml");
        // `[tls]` goes last: keys after a table header belong to it.
        let mut text = format!(
            "grpc_listen = \"127.0.0.1:0\"\ngrpc_socket = \"{d}/agent.sock\"\nmemory_socket = \"{d}/mem.sock\"\nmetrics_listen = \"127.0.0.1:0\"\naddr_file = \"{d}/agent.addr\"\nstate_dir = \"{d}/state\"\n[limits]\n{}\n[dataplane]\n{}\n[s3]\n{}\n[qos]\n{}\n[failover]\n{}\n[credentials.main]\naccess_key = \"{ak}\"\nsecret_key = \"{sk}\"\n[credentials.good]\naccess_key = \"{ACCESS_KEY}\"\nsecret_key = \"{SECRET_KEY}\"\n\n[[tenants]]\nname = \"alpha\"\nshim_secret_file = \"alpha.shim-secret\"\n{}[[tenants.namespaces]]\nname = \"data\"\nendpoints = [{}]\nbucket = \"data\"\ncredentials = \"main\"\n{}\n[[tenants.namespaces]]\nname = \"plain\"\nendpoints = [{}]\nbucket = \"data\"\ncredentials = \"main\"\n[[tenants.namespaces]]\nname = \"scoped\"\nendpoints = [\"{scheme}://{gw}\"]\n{store_ca}bucket = \"data\"\nprefix = \"{scoped}\"\ncredentials = \"main\"\n\n[[tenants]]\nname = \"beta\"\nshim_secret_file = \"beta.shim-secret\"\n{}[[tenants.namespaces]]\nname = \"other\"\nendpoints = [\"{scheme}://{gw}\"]\n{store_ca}bucket = \"other\"\ncredentials = \"good\"\n",
            opts.agent_limits, opts.agent_dataplane, opts.s3, opts.agent_qos, opts.agent_failover, opts.alpha, endpoints.join(", "), opts.data_ns, endpoints.join(", "), opts.beta, d = d.display(), scoped = opts.scoped_prefix);
        if opts.only_data {
            if let Some(at) = text.find("[[tenants.namespaces]]\nname = \"plain\"") {
                text.truncate(at);
            }
        }
        std::fs::write(&cfg, text + agent_tls).expect("write config");
        let mut agent = spawn(&d, "sluice-agent", &["--config", cfg.to_str().expect("utf8")]);
        let addrs = wait_file(&d.join("agent.addr"), &mut agent, "sluice-agent", &d.join("sluice-agent.log"));
        let grpc_addr: SocketAddr = addrs
            .lines()
            .find_map(|l| l.strip_prefix("grpc = "))
            .map(|v| v.trim_matches('"').parse().expect("grpc addr"))
            .expect("grpc line");
        let metrics_addr: SocketAddr = addrs
            .lines()
            .find_map(|l| l.strip_prefix("metrics = "))
            .map(|v| v.trim_matches('"').parse().expect("metrics addr"))
            .expect("metrics line");
        pin_address(&cfg, "grpc_listen", &grpc_addr.to_string());
        pin_address(&cfg, "metrics_listen", &metrics_addr.to_string());
        children.push(Proc { name: "sluice-agent".into(), binary: "sluice-agent", config: cfg, child: agent });

        let uid = unsafe_free_uid();
        let callers = opts.callers.unwrap_or_else(|| format!("[[callers]]\nuid = {uid}\ntenant = \"alpha\"\n"));
        let socket = d.join("shim.sock");
        let cfg = d.join("shim.toml");
        // 4 GiB regions unless the test sets its own limit.
        let region_limit =
            if opts.shim_limits.contains("max_region_bytes") { "" } else { "max_region_bytes = 4294967296\n" };
        let grpc = match (&opts.shim_agent, opts.grpc_over_tcp) {
            (Some(a), _) => a.clone(),
            (None, true) if opts.tls => format!("https://{grpc_addr}"),
            (None, true) => format!("http://{grpc_addr}"),
            (None, false) => format!("unix:{}/agent.sock", d.display()),
        };
        std::fs::write(&cfg, format!(
            "socket = \"{}\"\nsocket_mode = 0o600\n{}\n[agent]\n{}\n{}memory_socket = \"{d}/mem.sock\"\n[limits]\n{region_limit}{}\n{callers}\n[tenant_secrets]\nalpha = \"alpha.shim-secret\"\nbeta = \"beta.shim-secret\"\n",
            socket.display(), opts.shim_extra, agent_link(&grpc, "alpha"), opts.shim_agent_extra, opts.shim_limits, d = d.display())).expect("write config");
        children.push(start_shim(&d, "sluice-shim", &cfg, &socket));
        let beta_socket = d.join("shim-beta.sock");
        if opts.beta_shim {
            let cfg = d.join("shim-beta.toml");
            std::fs::write(&cfg, format!(
                "socket = \"{}\"\nsocket_mode = 0o600\nshim_id = \"beta-shim\"\n[agent]\ngrpc = \"unix:{d}/agent.sock\"\nmemory_socket = \"{d}/mem.sock\"\n[[callers]]\nuid = {uid}\ntenant = \"beta\"\n[tenant_secrets]\nbeta = \"beta.shim-secret\"\n",
                beta_socket.display(), d = d.display())).expect("write config");
            children.push(start_shim(&d, "sluice-shim-beta", &cfg, &beta_socket));
        }
        Self { dir, gateway_addr, metrics_addr, grpc_addr, socket, beta_socket, data_dir, children }
    }

    /// Starts one more shim `name` for tenant alpha whose `[agent]` table is
    /// `agent` (e.g. from [`agent_link`] or hand-written TLS settings);
    /// returns its socket, or the shim's log if it exited at start.
    pub fn start_extra_shim(&mut self, name: &str, agent: &str) -> Result<PathBuf, String> {
        let d = self.dir.path().to_owned();
        let socket = d.join(format!("{name}.sock"));
        let cfg = d.join(format!("{name}.toml"));
        let uid = unsafe_free_uid();
        std::fs::write(&cfg, format!(
            "socket = \"{}\"\nsocket_mode = 0o600\nshim_id = \"{name}\"\n[agent]\n{agent}\nmemory_socket = \"{d}/mem.sock\"\n[[callers]]\nuid = {uid}\ntenant = \"alpha\"\n[tenant_secrets]\nalpha = \"alpha.shim-secret\"\n",
            socket.display(), d = d.display())).expect("write config");
        let mut child = spawn_as(&d, "sluice-shim", name, &["--config", cfg.to_str().expect("utf8")]);
        let t0 = Instant::now();
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            if let Ok(Some(_)) = child.try_wait() {
                return Err(std::fs::read_to_string(d.join(format!("{name}.log"))).unwrap_or_default());
            }
            assert!(t0.elapsed() < Duration::from_secs(30), "{name} did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        self.children.push(Proc { name: name.to_owned(), binary: "sluice-shim", config: cfg, child });
        Ok(socket)
    }

    /// Connects a client to the shim.
    pub async fn client(&self) -> sluice_client::Client {
        sluice_client::Client::connect(&self.socket).await.expect("connect to shim")
    }

    /// Kills one process (e.g. "sluice-gateway") with SIGKILL.
    pub fn kill(&mut self, name: &str) {
        for p in &mut self.children {
            if p.name == name {
                let _ = p.child.kill();
                let _ = p.child.wait();
            }
        }
    }

    /// Starts a killed process again from its config, on the same
    /// addresses, and waits until it serves.
    pub fn restart(&mut self, name: &str) {
        let d = self.dir.path().to_owned();
        let shim_socket = if name == "sluice-shim" { self.socket.clone() } else { self.beta_socket.clone() };
        let p = self.children.iter_mut().find(|p| p.name == name).unwrap_or_else(|| panic!("no process {name}"));
        let _ = p.child.kill();
        let _ = p.child.wait();
        let ready = match p.binary {
            "sluice-gateway" => Some(d.join("gw.addr")),
            "sluice-agent" => Some(d.join("agent.addr")),
            _ => None,
        };
        if let Some(f) = &ready {
            let _ = std::fs::remove_file(f);
        }
        p.child = spawn_as(&d, p.binary, &p.name, &["--config", p.config.to_str().expect("utf8")]);
        match &ready {
            Some(f) => {
                wait_file(f, &mut p.child, name, &d.join(format!("{name}.log")));
            }
            None => wait_socket(&d, p, &shim_socket),
        }
    }

    /// Whether the process is still running (not exited, not killed).
    pub fn alive(&mut self, name: &str) -> bool {
        self.children.iter_mut().find(|p| p.name == name).is_some_and(|p| matches!(p.child.try_wait(), Ok(None)))
    }

    /// Open descriptors of one of the stack's processes.
    pub fn fd_count(&self, name: &str) -> usize {
        let pid = self.pid(name).unwrap_or_else(|| panic!("no process {name}"));
        std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
    }

    /// What a process's descriptors point at, counted (for failure messages).
    pub fn fd_targets(&self, name: &str) -> std::collections::BTreeMap<String, usize> {
        let pid = self.pid(name).unwrap_or_else(|| panic!("no process {name}"));
        let mut out = std::collections::BTreeMap::new();
        for e in std::fs::read_dir(format!("/proc/{pid}/fd")).into_iter().flatten().flatten() {
            let t = std::fs::read_link(e.path()).map(|t| t.to_string_lossy().into_owned()).unwrap_or_default();
            // Sockets differ only by inode: count them by kind.
            let kind = if t.starts_with("socket:") { "socket".to_owned() } else { t };
            *out.entry(kind).or_default() += 1;
        }
        out
    }

    /// Open descriptors of a process other than its idle pooled HTTP
    /// connections to the gateway (a client keeps up to its pool size open
    /// for reuse; they are not leaks).
    pub fn fd_count_unpooled(&self, name: &str) -> usize {
        let pid = self.pid(name).unwrap_or_else(|| panic!("no process {name}"));
        let Some(gw) = self.gateway_addr else { return self.fd_count(name) };
        // Socket inodes with the gateway's port as their remote end.
        let port = format!(":{:04X}", gw.port());
        let mut to_gateway = std::collections::HashSet::new();
        for table in ["tcp", "tcp6"] {
            let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
            for line in text.lines().skip(1) {
                let f: Vec<&str> = line.split_whitespace().collect();
                if f.len() > 9 && f[2].ends_with(&port) {
                    to_gateway.insert(format!("socket:[{}]", f[9]));
                }
            }
        }
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|d| {
                d.flatten()
                    .filter(|e| {
                        std::fs::read_link(e.path())
                            .map(|t| !to_gateway.contains(t.to_string_lossy().as_ref()))
                            .unwrap_or(true)
                    })
                    .count()
            })
            .unwrap_or(0)
    }

    /// The process id of one of the stack's processes (e.g. "sluice-agent").
    pub fn pid(&self, name: &str) -> Option<u32> {
        self.children.iter().find(|p| p.name == name).map(|p| p.child.id())
    }

    /// Sends `signal` (e.g. "HUP") to one of the stack's processes with
    /// kill(1) (keeps the harness free of libc calls).
    pub fn signal(&self, name: &str, signal: &str) {
        let pid = self.pid(name).unwrap_or_else(|| panic!("no process {name}"));
        let status = Command::new("kill")
            .args([format!("-{signal}"), pid.to_string()])
            .status()
            .unwrap_or_else(|e| panic!("running kill: {e}"));
        assert!(status.success(), "kill -{signal} {pid} failed: {status}");
    }

    /// Sends SIGSTOP to one of the stack's processes and waits until every
    /// thread of it has stopped (kill(1) returns before they have: a
    /// thread running on another core goes on for a moment).
    pub fn stop(&self, name: &str) {
        self.signal(name, "STOP");
        let pid = self.pid(name).unwrap_or_else(|| panic!("no process {name}"));
        let all_stopped = || {
            std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten().all(|t| {
                let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
                // The state follows the command name's closing parenthesis.
                stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('T'))
            })
        };
        let t0 = std::time::Instant::now();
        while !all_stopped() {
            assert!(t0.elapsed() < std::time::Duration::from_secs(10), "{name} did not stop");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// The agent's Prometheus text.
    pub fn metrics(&self) -> String {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(self.metrics_addr).expect("metrics connect");
        write!(s, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").expect("metrics write");
        let mut out = String::new();
        s.read_to_string(&mut out).expect("metrics read");
        out
    }

    /// The agent's `/ready`: (HTTP status, body).
    pub fn ready(&self) -> (u16, String) {
        ready_at(self.metrics_addr)
    }

    /// Sum of a metric's samples whose line contains all `filters`.
    pub fn metric(&self, name: &str, filters: &[&str]) -> f64 {
        self.metrics()
            .lines()
            .filter(|l| l.starts_with(name) && filters.iter().all(|f| l.contains(f)))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Where the embedded store keeps `bucket/key` (the independent oracle).
    pub fn stored_file(&self, bucket: &str, key: &str) -> PathBuf {
        self.data_dir.join(bucket).join(key)
    }

    /// The shim's log so far (for assertions and debugging).
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{name}.log"))).unwrap_or_default()
    }
}

/// Replaces `key = ...` at the start of a line of a generated config with
/// the address a daemon bound, so a restart comes back on it.
fn pin_address(config: &Path, key: &str, addr: &str) {
    let text = std::fs::read_to_string(config).expect("read config");
    let prefix = format!("{key} = ");
    let pinned: String = text
        .lines()
        .map(|l| if l.starts_with(&prefix) { format!("{key} = \"{addr}\"\n") } else { format!("{l}\n") })
        .collect();
    std::fs::write(config, pinned).expect("write config");
}

/// This process's uid, read from /proc (keeps the harness free of libc calls).
pub fn unsafe_free_uid() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("Uid line")
}

/// `GET /ready` of the operations endpoint at `addr`: (HTTP status, body).
pub fn ready_at(addr: SocketAddr) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("ready connect");
    write!(s, "GET /ready HTTP/1.0\r\nHost: x\r\n\r\n").expect("ready write");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("ready read");
    let status = out.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, out.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default())
}

/// The value of metric `name` (no labels) at the operations endpoint
/// `addr` (a shim's `metrics_listen`, say).
pub fn counter_at(addr: SocketAddr, name: &str) -> f64 {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("metrics connect");
    write!(s, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").expect("metrics write");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("metrics read");
    out.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {out}"))
}

/// Deterministic pseudo-random bytes.
/// A process's peak resident memory (VmHWM), KiB.
pub fn peak_rss_kib(pid: u32) -> i64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap_or_else(|| panic!("no VmHWM for {pid}"));
    line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("{line}"))
}

pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = vec![0u8; len];
    for chunk in out.chunks_mut(8) {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        let v = x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
    out
}

/// SHA-256 hex.
pub fn sha256(data: &[u8]) -> String {
    hex::encode(ring::digest::digest(&ring::digest::SHA256, data))
}

/// Runs the boto3 oracle script (an S3 client unrelated to ours).
/// `SLUICE_TEST_PYTHON` names the interpreter (scripts/test sets up a venv).
pub fn boto3(gateway: SocketAddr, args: &[&str]) -> String {
    boto3_as(gateway, (ACCESS_KEY, SECRET_KEY), args)
}

/// [`boto3`] against any S3 store, with its keys.
pub fn boto3_as(store: SocketAddr, (access_key, secret_key): (&str, &str), args: &[&str]) -> String {
    let python = std::env::var("SLUICE_TEST_PYTHON").unwrap_or_else(|_| {
        let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
        venv.to_string_lossy().into_owned()
    });
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("oracle/s3_oracle.py");
    let out = Command::new(&python)
        .arg(script)
        .arg(format!("http://{store}"))
        .args([access_key, secret_key])
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!("running {python}: {e} (scripts/test creates .venv with boto3; or set SLUICE_TEST_PYTHON)")
        });
    assert!(out.status.success(), "boto3 oracle failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A writer overwrites `path` with two versions (of `sizes`) while a reader
/// reads it whole, `reads` times. Every read must return one version byte
/// for byte or fail with PRECONDITION_FAILED — never bytes of both as
/// success. Returns (whole reads, refused reads).
pub async fn race_reads(stack: &Stack, path: &str, sizes: [usize; 2], reads: usize) -> (usize, usize) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let versions = [pattern(sizes[0], 101), pattern(sizes[1], 202)];
    let shas = [sha256(&versions[0]), sha256(&versions[1])];
    let size = sizes[0].max(sizes[1]);
    let writer = stack.client().await;
    let wr = writer.register(size as u64).await.expect("register");
    wr.write_at(0, &versions[0]).expect("fill");
    writer.put(path, &wr, 0, sizes[0] as u64).await.expect("first version");
    let stop = Arc::new(AtomicBool::new(false));
    let w = {
        let (stop, path, versions) = (stop.clone(), path.to_owned(), versions.clone());
        tokio::spawn(async move {
            let mut i = 1usize;
            while !stop.load(Ordering::Relaxed) {
                let v = &versions[i % 2];
                wr.write_at(0, v).expect("fill");
                writer.put(&path, &wr, 0, v.len() as u64).await.expect("overwrite");
                i += 1;
            }
            i
        })
    };
    let reader = stack.client().await;
    let r = reader.register(size as u64).await.expect("register");
    let (mut whole, mut refused) = (0, 0);
    for n in 0..reads {
        r.write_at(0, &vec![0u8; size]).expect("clear");
        match reader.get(path, &r, 0, None).await {
            Ok(t) => {
                let got = sha256(&r.as_slice()[..t.bytes as usize]);
                assert!(shas.contains(&got), "read {n} succeeded with bytes of neither version (a torn read)");
                whole += 1;
            }
            Err(e) if e.code() == Some(sluice_client::Code::PreconditionFailed) => refused += 1,
            Err(e) => panic!("read {n}: {e}"),
        }
    }
    stop.store(true, Ordering::Relaxed);
    let writes = w.await.expect("writer");
    report(&format!("torn-reads: {path}: reads={reads} whole={whole} refused={refused} writes={writes}"));
    (whole, refused)
}
