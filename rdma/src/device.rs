//! The device list.

use std::ffi::CStr;

use rdma_core_sys as sys;

use crate::error::{RdmaError, Result};

/// A verbs device as listed by libibverbs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    pub name: String,
    pub guid: u64,
}

/// Lists verbs devices. With no RDMA in the kernel libibverbs returns NULL
/// with ENOSYS; that, and an empty list, are `NoDevice`.
pub fn devices() -> Result<Vec<DeviceInfo>> {
    let mut n = 0i32;
    // SAFETY: ibv_get_device_list writes the count to `n` and returns a
    // NULL-terminated array it owns until ibv_free_device_list.
    let list = unsafe { sys::ibv_get_device_list(&mut n) };
    if list.is_null() {
        let e = std::io::Error::last_os_error();
        let why = if e.raw_os_error() == Some(libc::ENOSYS) {
            "the kernel has no RDMA support (ENOSYS)".to_owned()
        } else {
            format!("ibv_get_device_list: {e}")
        };
        return Err(RdmaError::NoDevice(why));
    }
    let mut out = Vec::new();
    for i in 0..n.max(0) as usize {
        // SAFETY: `list` has `n` valid entries.
        let dev = unsafe { *list.add(i) };
        if dev.is_null() {
            break;
        }
        // SAFETY: `dev` is a valid device from the list; the name is a
        // NUL-terminated string owned by it.
        let (name, guid) = unsafe {
            (
                CStr::from_ptr(sys::ibv_get_device_name(dev)).to_string_lossy().into_owned(),
                u64::from_be(sys::ibv_get_device_guid(dev)),
            )
        };
        out.push(DeviceInfo { name, guid });
    }
    // SAFETY: freed exactly once; no device pointer outlives this call.
    unsafe { sys::ibv_free_device_list(list) };
    if out.is_empty() {
        return Err(RdmaError::NoDevice("no verbs device is present".into()));
    }
    Ok(out)
}
