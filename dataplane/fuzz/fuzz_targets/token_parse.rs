//! x-amz-rdma-token arrives in HTTP headers from any client: parsing must
//! never panic, and whatever parses must format back to an equivalent token.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sluice_dataplane::Token;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data) {
        if let Ok(t) = Token::parse(s) {
            assert_eq!(Token::parse(&t.to_string()), Ok(t));
        }
    }
});
