//! `[dataplane]`: the agent's side of the one-sided transports (the `tcp`
//! listener, the verbs RC address, the DC device).

use serde::Deserialize;

/// The agent's side of the one-sided data plane.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataplaneConfig {
    /// Where the `tcp` transport listens for the stores' WRITE/READ
    /// operations. Port 0 picks one.
    pub tcp_listen: std::net::SocketAddr,
    /// Address put in descriptors (default: the bound address).
    pub tcp_advertise: Option<std::net::IpAddr>,
    /// IP address of the RDMA device the verbs RC transport listens on
    /// (rdma_cm); required when a namespace uses `transport = "verbs-rc"`.
    pub verbs_listen: Option<std::net::Ipv4Addr>,
    /// The mlx5 device for `transport = "dc"` namespaces.
    pub dc: Option<DcConfig>,
}

impl Default for DataplaneConfig {
    fn default() -> Self {
        Self {
            tcp_listen: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
            tcp_advertise: None,
            verbs_listen: None,
            dc: None,
        }
    }
}

/// Where the agent's DC targets live (one per tenant, each in the tenant's
/// protection domain).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DcConfig {
    /// Verbs device name, e.g. "mlx5_0".
    pub device: String,
    /// Port, 1-based.
    #[serde(default = "default_dc_port")]
    pub port: u8,
    /// Source GID index; absent picks the RoCE v2 entry with an IPv4 address.
    #[serde(default)]
    pub gid_index: Option<u8>,
    /// DC access key, the same on every peer (peers default to 0xffeeddcc).
    #[serde(default = "default_dc_key")]
    pub key: u64,
}

fn default_dc_port() -> u8 {
    1
}

fn default_dc_key() -> u64 {
    sluice_dataplane::dc::DEFAULT_DC_KEY
}

impl DcConfig {
    pub fn settings(&self) -> sluice_dataplane::dc::DcSettings {
        sluice_dataplane::dc::DcSettings {
            device: self.device.clone(),
            port: self.port,
            gid_index: self.gid_index,
            key: self.key,
        }
    }
}
