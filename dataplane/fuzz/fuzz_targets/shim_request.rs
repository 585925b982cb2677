//! Shim frames come from any local process.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sluice_proto::{shim, Message};

fuzz_target!(|data: &[u8]| {
    let _ = shim::Request::decode(data);
});
