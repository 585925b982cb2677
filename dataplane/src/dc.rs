//! The standard `x-amz-rdma-token` for mlx5 Dynamically Connected targets:
//! the window and its rkey, plus where the DC target is (LID, DCT number,
//! GID). Building it is pure and tested with fixed inputs; the DC target
//! itself lives in `sluice_rdma::dc` (unvalidated on hardware, see README).

use sluice_rdma::dc::DcAddress;

use crate::token::{Token, TokenError};

/// The 81-character standard descriptor for a registered window reachable
/// through DC target `at`.
pub fn standard_token(window_addr: u64, window_len: u32, rkey: u32, at: &DcAddress) -> Result<Token, TokenError> {
    Token::new(window_addr, window_len, rkey, at.lid, at.dct_number, at.gid)
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
}
