//! The mlx5 Dynamically Connected transport: the standard
//! `x-amz-rdma-token` every S3-over-RDMA peer speaks.
//!
//! * Owner (the agent): a DC target (DCT) per protection domain — one per
//!   tenant — and, per exposure, a memory region over exactly the window.
//!   The token is the window, its rkey, and where the DCT is (LID, DCT
//!   number, GID).
//! * Remote (the gateway): one DC initiator; each token becomes an address
//!   handle (see [`VerbsRemote::dc`]).
//!
//! Building the token is pure and tested with fixed inputs. Creating a DCT
//! or DCI on a device without DC (Soft-RoCE, non-mlx5) fails with
//! [`TransportError::Unsupported`], which the agent turns into a loud
//! fallback. Not yet validated on mlx5 hardware (see the README).

use std::sync::Arc;

use sluice_rdma::dc::{DcAddress, DcTarget};
use sluice_rdma::dci::DcInitiator;
use sluice_rdma::{pick_ipv4_gid, CompletionQueue, Context, GidEntry, ProtectionDomain};

use crate::capability::Grant;
use crate::token::{Token, TokenError};
use crate::transport::{
    Capabilities, Exposure, Transport, TransportError, TransportKind, MAX_OP_BYTES, MAX_WINDOW_BYTES,
};
use crate::verbs::{rdma_err, register_window, VerbsRemote};

pub use sluice_rdma::dc::DEFAULT_DC_KEY;

/// The 81-character standard descriptor for a registered window reachable
/// through DC target `at`.
pub fn standard_token(window_addr: u64, window_len: u32, rkey: u32, at: &DcAddress) -> Result<Token, TokenError> {
    Token::new(window_addr, window_len, rkey, at.lid, at.dct_number, at.gid)
}

/// Where DC runs, as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DcSettings {
    /// Verbs device name (`mlx5_0`).
    pub device: String,
    /// Port number, 1-based.
    pub port: u8,
    /// Source GID index; `None` picks the RoCE v2 entry with an IPv4 address.
    pub gid_index: Option<u8>,
    /// DC access key shared with the peers.
    pub key: u64,
}

impl Default for DcSettings {
    fn default() -> Self {
        Self { device: "mlx5_0".into(), port: 1, gid_index: None, key: DEFAULT_DC_KEY }
    }
}

/// The GID entry to use: the configured index, or the RoCE v2 IPv4 one.
fn choose_gid(entries: &[GidEntry], configured: Option<u8>) -> Result<GidEntry, TransportError> {
    match configured {
        Some(i) => entries
            .iter()
            .find(|e| e.index == i)
            .copied()
            .ok_or_else(|| TransportError::Unsupported(format!("GID index {i} is not populated on this port"))),
        None => pick_ipv4_gid(entries, None).or_else(|| entries.first().copied()).ok_or_else(|| {
            TransportError::Unsupported("the port has no GID; set gid_index or bring the interface up".into())
        }),
    }
}

/// An opened device ready for DC.
pub struct DcDevice {
    ctx: Arc<Context>,
    settings: DcSettings,
    gid: GidEntry,
    lid: u16,
}

impl DcDevice {
    /// Opens the configured device and port and picks the GID.
    pub fn open(settings: &DcSettings) -> Result<Self, TransportError> {
        let ctx = Context::open(&settings.device).map_err(rdma_err)?;
        let port = ctx.port(settings.port).map_err(rdma_err)?;
        let gid = choose_gid(&ctx.gids(settings.port).map_err(rdma_err)?, settings.gid_index)?;
        Ok(Self { ctx, settings: settings.clone(), gid, lid: port.lid })
    }

    /// A DC owner with its own protection domain (one per tenant).
    pub fn owner(&self) -> Result<Arc<DcOwner>, TransportError> {
        let pd = ProtectionDomain::new(&self.ctx).map_err(rdma_err)?;
        let cq = CompletionQueue::new(&self.ctx, 16).map_err(rdma_err)?;
        let target =
            DcTarget::create(&pd, &cq, self.settings.key, self.settings.port, self.gid.index).map_err(rdma_err)?;
        let at = DcAddress { dct_number: target.number(), lid: self.lid, gid: Some(self.gid.gid) };
        Ok(Arc::new(DcOwner { pd, target, at }))
    }

    /// The remote side: a DC initiator in its own protection domain.
    pub fn remote(&self) -> Result<VerbsRemote, TransportError> {
        let pd = ProtectionDomain::new(&self.ctx).map_err(rdma_err)?;
        let dci = DcInitiator::create(&pd, self.settings.port, self.gid.index, self.settings.key).map_err(rdma_err)?;
        Ok(VerbsRemote::dc(dci, self.settings.port, self.gid.index))
    }
}

/// The owner side of DC: exposes windows behind one DCT.
pub struct DcOwner {
    pd: Arc<ProtectionDomain>,
    target: DcTarget,
    at: DcAddress,
}

impl DcOwner {
    /// Where peers reach this owner.
    pub fn address(&self) -> DcAddress {
        self.at
    }

    /// The protection domain this owner's windows are registered in.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    pub fn dct_number(&self) -> u32 {
        self.target.number()
    }
}

impl Transport for DcOwner {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            kind: TransportKind::Dc,
            standard_token: true,
            max_op_bytes: MAX_OP_BYTES,
            max_window_bytes: MAX_WINDOW_BYTES,
        }
    }

    fn expose(&self, grant: Grant) -> Result<Exposure, TransportError> {
        let w = register_window(&self.pd, &grant)?;
        let token = standard_token(w.addr, grant.len as u32, w.rkey, &self.at)
            .map_err(|e| TransportError::Protocol(e.to_string()))?;
        Ok(Exposure { token, guard: w.guard, landing: None })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_token_from_a_dct() {
        // RoCE v2 over IPv4: GID ::ffff:10.0.2.15, LID 0.
        let gid = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 2, 15];
        let at = DcAddress { dct_number: 0x00_1a_2b, lid: 0, gid: Some(gid) };
        let t = standard_token(0x7f00_dead_0000, 0x0010_0000, 0x1234_5678, &at).unwrap();
        assert_eq!(t.to_string(), "00007f00dead0000:00100000:12345678:0000:001a2b:1:00000000000000000000ffff0a00020f");
        assert_eq!(t.to_string().len(), 81);
        // InfiniBand, LID-routed.
        let ib = DcAddress { dct_number: 7, lid: 0x0102, gid: None };
        assert_eq!(
            standard_token(0x1000, 4096, 9, &ib).unwrap().to_string(),
            "0000000000001000:00001000:00000009:0102:000007:0:00000000000000000000000000000000"
        );
        // A DCT number wider than 24 bits cannot be expressed.
        assert!(standard_token(0, 1, 1, &DcAddress { dct_number: 1 << 24, lid: 0, gid: None }).is_err());
    }

    #[test]
    fn token_round_trips_to_the_address_a_dci_builds() {
        let gid = std::net::Ipv4Addr::new(192, 168, 7, 9).to_ipv6_mapped().octets();
        let at = DcAddress { dct_number: 0xabcdef, lid: 0, gid: Some(gid) };
        let t = Token::parse(&standard_token(0x10_0000, 8192, 0x55, &at).unwrap().to_string()).unwrap();
        let back = DcAddress { dct_number: t.dct, lid: t.lid, gid: t.gid };
        assert_eq!(back, at);
        let ah = sluice_rdma::dc::ah_attr(&back, 1, 3);
        assert_eq!((ah.is_global, ah.grh.sgid_index, ah.port_num), (1, 3, 1));
    }

    #[test]
    fn gid_choice() {
        let v4 =
            GidEntry { index: 3, gid: std::net::Ipv4Addr::new(10, 0, 0, 1).to_ipv6_mapped().octets(), roce_v2: true };
        let ll = GidEntry { index: 0, gid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8], roce_v2: false };
        assert_eq!(choose_gid(&[ll, v4], None).unwrap().index, 3);
        assert_eq!(choose_gid(&[ll], None).unwrap().index, 0);
        assert_eq!(choose_gid(&[ll, v4], Some(0)).unwrap().index, 0);
        assert!(matches!(choose_gid(&[ll], Some(5)), Err(TransportError::Unsupported(_))));
        assert!(matches!(choose_gid(&[], None), Err(TransportError::Unsupported(_))));
    }

    #[test]
    fn settings_default_to_the_peers_key() {
        assert_eq!(DcSettings::default().key, 0xffee_ddcc);
    }

    /// Without RDMA in the kernel (the normal test run), or with only
    /// Soft-RoCE, opening an mlx5 device is a clear error. (DC creation on a
    /// device that exists but lacks DC is tested on rxe0 in the VM lane.)
    #[test]
    fn no_device_is_a_clear_error() {
        let e = DcDevice::open(&DcSettings::default()).err().expect("no mlx5 device here");
        assert!(e.to_string().contains("no RDMA device"), "{e}");
    }
}
