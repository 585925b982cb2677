//! Port and GID-table queries: what a DC target puts in its token (LID,
//! GID) and which source GID a DC initiator uses to reach a peer.

use rdma_core_sys as sys;

use crate::error::{RdmaError, Result};
use crate::memory::Context;

/// What the standard token and the address handles need from a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortInfo {
    pub lid: u16,
    /// Whether the port is up (IBV_PORT_ACTIVE).
    pub active: bool,
    /// Entries in the GID table.
    pub gid_table_len: u32,
    /// Largest message one work request may carry.
    pub max_message: u32,
}

/// One GID-table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GidEntry {
    pub index: u8,
    pub gid: [u8; 16],
    /// RoCE v2 (UDP-encapsulated, routable) rather than RoCE v1 or IB.
    pub roce_v2: bool,
}

impl GidEntry {
    /// The IPv4 address of an IPv4-mapped GID (`::ffff:a.b.c.d`).
    pub fn ipv4(&self) -> Option<std::net::Ipv4Addr> {
        std::net::Ipv6Addr::from(self.gid).to_ipv4_mapped()
    }
}

/// The entry RoCE peers address by IPv4: the first RoCE v2 entry with an
/// IPv4-mapped GID (equal to `ip` when given), else the first IPv4-mapped
/// entry of any type.
pub fn pick_ipv4_gid(entries: &[GidEntry], ip: Option<std::net::Ipv4Addr>) -> Option<GidEntry> {
    let wanted = |e: &&GidEntry| e.ipv4().is_some_and(|a| ip.is_none_or(|want| a == want));
    entries.iter().filter(wanted).find(|e| e.roce_v2).or_else(|| entries.iter().find(wanted)).copied()
}

impl Context {
    /// Queries `port` (1-based).
    pub fn port(&self, port: u8) -> Result<PortInfo> {
        let mut attr = sys::ibv_port_attr::default();
        // SAFETY: the context is live; `attr` is a full ibv_port_attr that
        // outlives the call (the inline wrapper passes its size).
        let r = unsafe { sys::___ibv_query_port(self.ptr.as_ptr(), port, &mut attr) };
        if r != 0 {
            return Err(RdmaError::from_ret("ibv_query_port", r));
        }
        Ok(PortInfo {
            lid: attr.lid,
            active: attr.state == sys::IBV_PORT_ACTIVE,
            gid_table_len: attr.gid_tbl_len.max(0) as u32,
            max_message: attr.max_msg_sz,
        })
    }

    /// The populated entries of `port`'s GID table.
    pub fn gids(&self, port: u8) -> Result<Vec<GidEntry>> {
        let info = self.port(port)?;
        let mut out = Vec::new();
        for index in 0..info.gid_table_len.min(256) {
            let mut e = sys::ibv_gid_entry::default();
            // SAFETY: the context is live; `e` outlives the call.
            let r = unsafe { sys::ibv_query_gid_ex(self.ptr.as_ptr(), u32::from(port), index, &mut e, 0) };
            if r != 0 {
                // Unpopulated slots answer ENODATA; skip them.
                continue;
            }
            // SAFETY: reading the raw byte view of the GID union.
            let gid = unsafe { e.gid.raw };
            if gid == [0; 16] {
                continue;
            }
            out.push(GidEntry { index: index as u8, gid, roce_v2: e.gid_type == sys::IBV_GID_TYPE_ROCE_V2 });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapped(a: [u8; 4]) -> [u8; 16] {
        std::net::Ipv4Addr::from(a).to_ipv6_mapped().octets()
    }

    #[test]
    fn picks_the_roce_v2_ipv4_entry() {
        let link_local = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
        let table = [
            GidEntry { index: 0, gid: link_local, roce_v2: false },
            GidEntry { index: 1, gid: link_local, roce_v2: true },
            GidEntry { index: 2, gid: mapped([10, 0, 2, 15]), roce_v2: false },
            GidEntry { index: 3, gid: mapped([10, 0, 2, 15]), roce_v2: true },
            GidEntry { index: 4, gid: mapped([192, 168, 1, 2]), roce_v2: true },
        ];
        assert_eq!(pick_ipv4_gid(&table, None).map(|e| e.index), Some(3));
        assert_eq!(pick_ipv4_gid(&table, Some([192, 168, 1, 2].into())).map(|e| e.index), Some(4));
        assert_eq!(pick_ipv4_gid(&table[..3], None).map(|e| e.index), Some(2));
        assert_eq!(pick_ipv4_gid(&table[..2], None), None);
        assert_eq!(pick_ipv4_gid(&table, Some([1, 1, 1, 1].into())), None);
    }
}
