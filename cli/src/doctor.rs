//! `sluice doctor`: checks this node end to end, one step after the other,
//! and says what to fix at the first step that fails: the shim's socket,
//! the caller's tenant, the agent (session, TLS), each namespace's store
//! (reachable, signature accepted, bucket), and the data path a read takes
//! (RDMA, or the reason it fell back). Then the GPU: the CUDA driver, the
//! GPUs, pinned staging, the GPU paths (gpu_doctor.rs).

use std::path::Path;

use serde_json::json;
use sluice_client::{Client, ClientError, Code};

/// `sluice doctor --help`.
#[derive(clap::Args, Debug)]
pub struct DoctorArgs {
    /// Also write, read back and delete a 1 MiB probe object
    /// (`.sluice-doctor/probe`) in each namespace the tenant may write, to
    /// see the data path of a transfer large enough for RDMA.
    #[arg(long)]
    pub write: bool,
}

/// One check's outcome.
pub(crate) struct Check {
    what: String,
    ok: bool,
    /// Nothing to check, only to say (e.g. no GPU on this node): not a failure.
    info: bool,
    detail: String,
    /// What to do about a failure.
    fix: String,
}

impl Check {
    pub(crate) fn pass(what: impl Into<String>, detail: impl Into<String>) -> Self {
        Self { what: what.into(), ok: true, info: false, detail: detail.into(), fix: String::new() }
    }
    pub(crate) fn fail(what: impl Into<String>, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Self { what: what.into(), ok: false, info: false, detail: detail.into(), fix: fix.into() }
    }
    pub(crate) fn info(what: impl Into<String>, detail: impl Into<String>) -> Self {
        Self { info: true, ..Self::pass(what, detail) }
    }
}

/// What to do about an error a namespace's first request got.
fn fix_for(e: &ClientError) -> String {
    let msg = e.to_string();
    match e.code() {
        Some(Code::AgentUnavailable) if msg.contains("TLS") || msg.contains("certificate") => {
            "the agent refused this shim's TLS certificate or the shim does not trust the agent's: check \
             [agent.tls] in the shim config against the agent's [tls] (see the agent's log)"
                .into()
        }
        Some(Code::AgentUnavailable) => "the shim cannot reach the agent: is sluice-agent running, and does the \
             shim's [agent] grpc name its address (unix:/path, or https:// with [agent.tls])?"
            .into(),
        Some(Code::Unauthenticated) => "the agent does not accept this shim for the tenant: the shim's \
             [tenant_secrets] file must hold the same bytes as the tenant's shim_secret_file on the agent, \
             and the clocks must agree within 2 minutes"
            .into(),
        Some(Code::AccessDenied) if msg.contains("store denied") => "the store refused the agent's signature: \
             check the namespace's [credentials] (access key, secret) and region in the agent config"
            .into(),
        Some(Code::AccessDenied) => "the tenant may not do this: check the namespace's `access` list, or \
             shim_origins / shims / tls_client_names in the agent config"
            .into(),
        Some(Code::NoSuchBucket) => {
            "the namespace's bucket does not exist in the store: create it or fix `bucket`".into()
        }
        Some(Code::StoreUnavailable) => {
            "the agent cannot reach the store: check the namespace's `endpoints` and the network from the agent".into()
        }
        Some(Code::UnknownTenant) => "the agent has no such tenant: add it to the agent config".into(),
        _ => "see the message; the agent's log has the request id".into(),
    }
}

async fn namespace_checks(c: &Client, ns: &str, write: bool, out: &mut Vec<Check>) {
    let what = format!("namespace {ns}: store reachable, signature accepted");
    let page = match c.list_page(ns, "", 1, "").await {
        Ok(p) => {
            out.push(Check::pass(&what, format!("listed {} object(s) on the first page", p.objects.len())));
            p
        }
        Err(e) => {
            out.push(Check::fail(&what, e.to_string(), fix_for(&e)));
            return;
        }
    };
    let what = format!("namespace {ns}: data path");
    if write {
        out.push(
            probe(c, ns).await.unwrap_or_else(|(e, step)| Check::fail(&what, format!("{step}: {e}"), fix_for(&e))),
        );
        return;
    }
    let Some(obj) = page.objects.first() else {
        out.push(Check::pass(&what, "no object to read; run with --write to probe the data path"));
        return;
    };
    let len = obj.size.clamp(1, 1 << 20);
    let read = async {
        let r = c.register(len).await?;
        let t = c.get(&format!("{ns}/{}", obj.key), &r, 0, Some((0, Some(len)))).await;
        c.release(r).await?;
        t
    };
    out.push(match read.await {
        Ok(t) => Check::pass(&what, path_of(&t)),
        Err(e) => Check::fail(&what, format!("reading {}: {e}", obj.key), fix_for(&e)),
    });
}

/// Whether the shim and the agent agree on some region memory (from the
/// capabilities exchanged at the handshake).
fn memory_check(caps: &sluice_client::Capabilities) -> Check {
    let name = |k: sluice_client::MemoryKind| k.as_str_name().to_ascii_lowercase().replace('_', "-");
    let both: Vec<String> = caps.agent_memory().filter(|k| caps.shim_memory().any(|s| s == *k)).map(name).collect();
    let agent: Vec<String> = caps.agent_memory().map(name).collect();
    let shim: Vec<String> = caps.shim_memory().map(name).collect();
    if both.is_empty() {
        Check::fail(
            "region memory",
            format!("the agent reaches {} but the shim registers {}", agent.join(", "), shim.join(", ")),
            "co-located agent: memory_backend = \"colocated\" in shim.toml; agent on a BlueField: \
             memory_backend = \"doca\" in shim.toml and [host_memory] backend = \"doca\" in agent.toml",
        )
    } else {
        Check::pass("region memory", both.join(", "))
    }
}

fn path_of(t: &sluice_client::Transfer) -> String {
    if t.fallback_reason.is_empty() {
        format!("{} bytes via {}", t.bytes, t.data_path)
    } else {
        format!("{} bytes via {} (fell back: {})", t.bytes, t.data_path, t.fallback_reason)
    }
}

/// Writes, reads back and deletes a 1 MiB probe object.
async fn probe(c: &Client, ns: &str) -> Result<Check, (ClientError, &'static str)> {
    let path = format!("{ns}/.sluice-doctor/probe");
    let len = 1u64 << 20;
    let r = c.register(len).await.map_err(|e| (e, "registering memory"))?;
    let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    r.write_at(0, &data).map_err(|e| (ClientError::Protocol(e.to_string()), "writing the probe"))?;
    let put = c.put(&path, &r, 0, len).await.map_err(|e| (e, "PUT"))?;
    r.write_at(0, &vec![0; len as usize]).map_err(|e| (ClientError::Protocol(e.to_string()), "clearing"))?;
    let get = c.get(&path, &r, 0, None).await.map_err(|e| (e, "GET"))?;
    let same = r.as_slice()[..len as usize] == data[..];
    let _ = c.delete(&path).await;
    let _ = c.release(r).await;
    let detail = format!("PUT {}; GET {}", path_of(&put), path_of(&get));
    Ok(if same {
        Check::pass(format!("namespace {ns}: data path"), detail)
    } else {
        Check::fail(
            format!("namespace {ns}: data path"),
            format!("{detail}; the bytes read back differ from those written"),
            "report this: a read returned wrong bytes as success",
        )
    })
}

pub async fn run(socket: &Path, args: &DoctorArgs, json: bool) -> anyhow::Result<()> {
    let mut checks = Vec::new();
    let mut caps = None;
    match Client::connect(socket).await {
        // The shim answered, but could not open the tenant's session.
        Err(e @ ClientError::Shim { .. }) => {
            checks.push(Check::pass("shim socket", socket.display().to_string()));
            let fix = fix_for(&e);
            checks.push(Check::fail("tenant session", e.to_string(), fix));
        }
        Err(e) => checks.push(Check::fail(
            "shim socket",
            e.to_string(),
            format!(
                "start sluice-shim (systemctl status sluice-shim), or point --socket at its socket; \
                 the socket must be writable by this user ({})",
                socket.display()
            ),
        )),
        Ok(c) => {
            checks.push(Check::pass("shim socket", socket.display().to_string()));
            checks.push(Check::pass("tenant", format!("{} (namespaces: {})", c.tenant(), c.namespaces().join(", "))));
            if c.namespaces().is_empty() {
                checks.push(Check::fail(
                    "namespaces",
                    "the tenant has none",
                    "add [[tenants.namespaces]] to the tenant in the agent config",
                ));
            }
            checks.push(memory_check(c.capabilities()));
            caps = Some(c.capabilities().clone());
            for ns in c.namespaces() {
                if let Some(n) = c.capabilities().namespaces.iter().find(|n| n.name == *ns) {
                    if !n.degraded_reason.is_empty() {
                        checks.push(Check::fail(
                            format!("namespace {ns}: transport"),
                            format!("the configured transport is not running: {}", n.degraded_reason),
                            "bytes move, but over the fallback: check the agent's [dataplane] (device, \
                             verbs_listen, [dataplane.dc]) and its startup log",
                        ));
                    }
                }
                namespace_checks(&c, ns, args.write, &mut checks).await;
            }
        }
    }
    checks.extend(crate::gpu_doctor::checks(caps.as_ref()));
    let failed = checks.iter().filter(|c| !c.ok).count();
    if json {
        let list: Vec<_> = checks
            .iter()
            .map(|c| json!({ "check": c.what, "ok": c.ok, "info": c.info, "detail": c.detail, "fix": c.fix }))
            .collect();
        println!("{}", json!({ "checks": list, "failed": failed }));
    } else {
        for c in &checks {
            let mark = match (c.ok, c.info) {
                (false, _) => "FAIL",
                (true, true) => "info",
                (true, false) => "ok  ",
            };
            println!("{mark} {}: {}", c.what, c.detail);
            if !c.ok {
                println!("     fix: {}", c.fix);
            }
        }
    }
    if failed > 0 {
        anyhow::bail!("{failed} check(s) failed");
    }
    Ok(())
}
