//! `sluice certs`: a private CA and the certificates of the control channel
//! between shims and the agent (mutual TLS), and of the storage gateway
//! (HTTPS between the agent and sluice-gateway).
//!
//! The agent gets a server certificate for the names shims dial it by; each
//! shim gets a client certificate whose common name (and DNS name) is what
//! the agent's `[[tenants]] tls_client_names` lists (by default the tenant's
//! own name); the gateway gets a server certificate for the names agents
//! reach it by (its namespaces' https:// endpoints), which agents trust with
//! `ca_file = ca.crt`. Keys are written 0600; an existing CA is reused, so
//! certificates can be added later without re-issuing the others.

use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    SanType,
};

/// `sluice certs --help`.
#[derive(clap::Args, Debug)]
pub struct CertsArgs {
    /// Directory for ca.crt/ca.key, agent.crt/agent.key and
    /// shim-<name>.crt/.key (created 0700 if missing).
    #[arg(long, default_value = "/etc/sluice/tls")]
    pub dir: PathBuf,
    /// Names (DNS or IP) shims dial the agent by; the first is its common
    /// name. Repeat for more. Empty: no agent certificate is issued.
    #[arg(long = "agent-name")]
    pub agent_names: Vec<String>,
    /// A client certificate for a shim serving this name (a tenant, or a
    /// name listed in a tenant's `tls_client_names`). Repeat for more.
    #[arg(long = "shim")]
    pub shims: Vec<String>,
    /// Names (DNS or IP) agents reach sluice-gateway by (the host of the
    /// namespaces' https:// endpoints): gateway.crt/gateway.key for the
    /// gateway's `[tls]`. Repeat for more. Empty: none is issued.
    #[arg(long = "gateway-name")]
    pub gateway_names: Vec<String>,
    /// Validity of the issued certificates, in days.
    #[arg(long, default_value_t = 825)]
    pub days: u32,
}

const CA_CERT: &str = "ca.crt";
const CA_KEY: &str = "ca.key";

/// Writes `text` to `path` with mode `mode`, replacing it atomically.
fn write(path: &Path, text: &str, mode: u32) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(text.as_bytes()).and_then(|()| f.sync_all()).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))
}

fn validity(params: &mut CertificateParams, days: u32) {
    let now = std::time::SystemTime::now();
    // An hour of slack for clocks that are a little behind.
    params.not_before = (now - std::time::Duration::from_secs(3600)).into();
    params.not_after = (now + std::time::Duration::from_secs(u64::from(days) * 86_400)).into();
}

/// The CA in `dir`, created if absent.
fn ca(dir: &Path, days: u32) -> anyhow::Result<(Issuer<'static, KeyPair>, bool)> {
    let (cert_path, key_path) = (dir.join(CA_CERT), dir.join(CA_KEY));
    if cert_path.exists() || key_path.exists() {
        let key_pem = std::fs::read_to_string(&key_path).with_context(|| format!("reading {}", key_path.display()))?;
        let cert_pem =
            std::fs::read_to_string(&cert_path).with_context(|| format!("reading {}", cert_path.display()))?;
        let key = KeyPair::from_pem(&key_pem).context("the CA key")?;
        return Ok((Issuer::from_ca_cert_pem(&cert_pem, key).context("the CA certificate")?, false));
    }
    let key = KeyPair::generate().context("generating the CA key")?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(DnType::CommonName, "Sluice private CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    // The CA outlives the certificates it issues.
    validity(&mut params, days.saturating_mul(2));
    let self_signed = params.self_signed(&key)?;
    write(&key_path, &key.serialize_pem(), 0o600)?;
    write(&cert_path, &self_signed.pem(), 0o644)?;
    Ok((Issuer::new(params, key), true))
}

/// Issues a certificate for `names` (the first is the common name).
fn issue(
    issuer: &Issuer<'_, KeyPair>,
    names: &[String],
    usage: ExtendedKeyUsagePurpose,
    days: u32,
) -> anyhow::Result<(String, String)> {
    let Some(first) = names.first() else { bail!("a certificate needs a name") };
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(DnType::CommonName, first.as_str());
    for n in names {
        params.subject_alt_names.push(match n.parse::<IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(n.as_str().try_into().with_context(|| format!("{n:?} is not a DNS name"))?),
        });
    }
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![usage];
    validity(&mut params, days);
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// A file name for a shim certificate of `name`.
fn shim_file(name: &str) -> anyhow::Result<String> {
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) || name.starts_with('.')
    {
        bail!("shim name {name:?}: use letters, digits, '-', '_' and '.'");
    }
    Ok(format!("shim-{name}"))
}

/// The certificates to issue, besides the CA.
pub struct Wanted<'a> {
    /// The agent's names (none: no agent certificate).
    pub agent_names: &'a [String],
    /// The gateway's names (none: no gateway certificate).
    pub gateway_names: &'a [String],
    /// One client certificate per name.
    pub shims: &'a [String],
    pub days: u32,
}

/// Issues what is asked into `dir` (the CA first, if absent); returns the
/// files written and whether the CA was created.
pub fn issue_all(dir: &Path, wanted: &Wanted<'_>) -> anyhow::Result<(Vec<PathBuf>, bool)> {
    let Wanted { agent_names, gateway_names, shims, days } = *wanted;
    let names: Vec<String> = shims.iter().map(|s| shim_file(s)).collect::<anyhow::Result<_>>()?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    let (issuer, created) = ca(dir, days)?;
    let mut written = vec![dir.join(CA_CERT)];
    for (server, names) in [("agent", agent_names), ("gateway", gateway_names)] {
        if names.is_empty() {
            continue;
        }
        let (cert, key) = issue(&issuer, names, ExtendedKeyUsagePurpose::ServerAuth, days)?;
        let (cert_path, key_path) = (dir.join(format!("{server}.crt")), dir.join(format!("{server}.key")));
        write(&key_path, &key, 0o600)?;
        write(&cert_path, &cert, 0o644)?;
        written.extend([cert_path, key_path]);
    }
    for (shim, file) in shims.iter().zip(&names) {
        let (cert, key) = issue(&issuer, std::slice::from_ref(shim), ExtendedKeyUsagePurpose::ClientAuth, days)?;
        write(&dir.join(format!("{file}.key")), &key, 0o600)?;
        write(&dir.join(format!("{file}.crt")), &cert, 0o644)?;
        written.extend([dir.join(format!("{file}.crt")), dir.join(format!("{file}.key"))]);
    }
    Ok((written, created))
}

pub fn run(args: &CertsArgs, json: bool) -> anyhow::Result<()> {
    if args.agent_names.is_empty() && args.shims.is_empty() && args.gateway_names.is_empty() {
        bail!("nothing to issue: give --agent-name, --shim and/or --gateway-name (see `sluice certs --help`)");
    }
    let wanted = Wanted {
        agent_names: &args.agent_names,
        gateway_names: &args.gateway_names,
        shims: &args.shims,
        days: args.days,
    };
    let (written, created) = issue_all(&args.dir, &wanted)?;
    if json {
        let files: Vec<String> = written.iter().map(|p| p.display().to_string()).collect();
        println!("{}", serde_json::json!({ "ca_created": created, "files": files }));
    } else {
        println!("{} CA in {}", if created { "created the" } else { "reused the" }, args.dir.display());
        for p in &written {
            println!("  {}", p.display());
        }
        println!(
            "agent: [tls] cert/key = agent.crt/agent.key, client_ca = ca.crt\n\
             shim:  [agent.tls] ca = ca.crt, cert/key = shim-<name>.crt/.key\n\
             gateway: [tls] cert/key = gateway.crt/gateway.key; agent namespaces: https:// endpoints, ca_file = ca.crt"
        );
    }
    Ok(())
}
