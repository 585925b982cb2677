//! The tcp transport's operation header comes from the remote store.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sluice_dataplane::tcp::wire::{Header, HEADER_LEN};

fuzz_target!(|data: &[u8]| {
    if let Ok(b) = <[u8; HEADER_LEN]>::try_from(data) {
        if let Ok(h) = Header::decode(&b) {
            assert_eq!(Header::decode(&h.encode()), Ok(h));
        }
    }
});
