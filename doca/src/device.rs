//! Loading DOCA and opening devices.

use std::ffi::c_char;
use std::ptr::NonNull;
use std::sync::Arc;

use doca_sys as sys;

use crate::error::{check, Error};
use crate::export::is_pci_address;

/// The loaded DOCA libraries, shared by every object made from them.
pub type Lib = Arc<sys::Doca>;

/// Loads DOCA from `$DOCA_LIB_DIR` or the DOCA default folder.
pub fn load() -> Result<Lib, Error> {
    Ok(Arc::new(sys::Doca::load()?))
}

/// Loads DOCA from `dir`.
pub fn load_from(dir: &std::path::Path) -> Result<Lib, Error> {
    Ok(Arc::new(sys::Doca::load_from(dir)?))
}

/// A device as listed, before opening.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// `DDDD:BB:DD.F`.
    pub pci: String,
    /// The verbs device name, e.g. `mlx5_0`.
    pub ibdev: String,
}

fn c_string(buf: &[c_char]) -> String {
    // Treat the buffer as bytes up to the first NUL (DOCA fills fixed arrays).
    let bytes: Vec<u8> = buf.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Owns a `doca_devinfo_create_list` result.
struct DevList<'a> {
    lib: &'a sys::Doca,
    list: *mut *mut sys::doca_devinfo,
    n: usize,
}

impl<'a> DevList<'a> {
    fn new(lib: &'a sys::Doca) -> Result<Self, Error> {
        let mut list = std::ptr::null_mut();
        let mut n = 0u32;
        // SAFETY: out-pointers to locals; the list is freed in Drop.
        check("doca_devinfo_create_list", unsafe { lib.common.doca_devinfo_create_list(&mut list, &mut n) })?;
        Ok(Self { lib, list, n: n as usize })
    }

    fn get(&self, i: usize) -> *mut sys::doca_devinfo {
        // SAFETY: i < n, and the list holds n entries while self lives.
        unsafe { *self.list.add(i) }
    }

    fn info(&self, i: usize) -> Result<DeviceInfo, Error> {
        let d = self.get(i);
        let mut pci = [0 as c_char; sys::DOCA_DEVINFO_PCI_ADDR_SIZE];
        let mut ib = [0 as c_char; sys::DOCA_DEVINFO_IBDEV_NAME_SIZE];
        // SAFETY: `d` is a live list entry; the buffers have the sizes DOCA documents.
        check("doca_devinfo_get_pci_addr_str", unsafe {
            self.lib.common.doca_devinfo_get_pci_addr_str(d, pci.as_mut_ptr())
        })?;
        // SAFETY: as above; the size passed is the buffer's.
        check("doca_devinfo_get_ibdev_name", unsafe {
            self.lib.common.doca_devinfo_get_ibdev_name(d, ib.as_mut_ptr(), ib.len() as u32)
        })?;
        Ok(DeviceInfo { pci: c_string(&pci), ibdev: c_string(&ib) })
    }
}

impl Drop for DevList<'_> {
    fn drop(&mut self) {
        if !self.list.is_null() {
            // SAFETY: the list came from doca_devinfo_create_list; devices
            // opened from it stay valid after the list is destroyed.
            unsafe { self.lib.common.doca_devinfo_destroy_list(self.list) };
        }
    }
}

/// Lists the DOCA devices of this machine.
pub fn list(lib: &Lib) -> Result<Vec<DeviceInfo>, Error> {
    let l = DevList::new(lib)?;
    (0..l.n).map(|i| l.info(i)).collect()
}

/// Normalises `BB:DD.F` to `0000:BB:DD.F` and lower-cases hex digits.
fn normal_pci(s: &str) -> String {
    let s = s.to_ascii_lowercase();
    if s.matches(':').count() == 1 {
        format!("0000:{s}")
    } else {
        s
    }
}

/// An opened DOCA device.
pub struct Device {
    lib: Lib,
    ptr: NonNull<sys::doca_dev>,
    info: DeviceInfo,
    /// Opened from a verbs PD (the RDMA bridge): kept alive with the device.
    from_pd: Option<Arc<sluice_rdma::ProtectionDomain>>,
}

// SAFETY: a doca_dev is a handle to a device; DOCA allows using it from any
// thread, and Sluice only passes it as an argument to other DOCA calls.
unsafe impl Send for Device {}
// SAFETY: as above; no method mutates the device.
unsafe impl Sync for Device {}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device").field("pci", &self.info.pci).field("ibdev", &self.info.ibdev).finish()
    }
}

impl Device {
    /// Opens the device whose PCI address (`0000:03:00.0` or `03:00.0`) or
    /// verbs name (`mlx5_0`) is `selector`.
    pub fn open(lib: &Lib, selector: &str) -> Result<Arc<Self>, Error> {
        let l = DevList::new(lib)?;
        let mut found = Vec::new();
        for i in 0..l.n {
            let info = l.info(i)?;
            let hit = if is_pci_address(selector) {
                normal_pci(&info.pci) == normal_pci(selector)
            } else {
                info.ibdev == selector
            };
            if hit {
                let mut dev = std::ptr::null_mut();
                // SAFETY: a live list entry and an out-pointer; closed in Drop.
                check("doca_dev_open", unsafe { lib.common.doca_dev_open(l.get(i), &mut dev) })?;
                let ptr = NonNull::new(dev).ok_or(Error::Invalid("doca_dev_open returned NULL".into()))?;
                return Ok(Arc::new(Self { lib: lib.clone(), ptr, info, from_pd: None }));
            }
            found.push(format!("{} ({})", info.pci, info.ibdev));
        }
        Err(Error::NoDevice { wanted: selector.to_owned(), found })
    }

    /// A DOCA device over an existing verbs protection domain
    /// (`doca_rdma_bridge_open_dev_from_pd`), so DOCA memory keys are valid
    /// on that PD's queue pairs. The device keeps the PD alive.
    pub fn from_verbs_pd(lib: &Lib, pd: &Arc<sluice_rdma::ProtectionDomain>) -> Result<Arc<Self>, Error> {
        let raw = pd.as_raw().cast::<sys::ibv_pd>();
        let mut dev = std::ptr::null_mut();
        // SAFETY: `raw` is a live PD (we keep its Arc for the device's
        // lifetime); out-pointer to a local.
        check("doca_rdma_bridge_open_dev_from_pd", unsafe {
            lib.common.doca_rdma_bridge_open_dev_from_pd(raw, &mut dev)
        })?;
        let ptr = NonNull::new(dev).ok_or(Error::Invalid("doca_rdma_bridge_open_dev_from_pd returned NULL".into()))?;
        let info = DeviceInfo { pci: String::new(), ibdev: format!("verbs pd {raw:p}") };
        Ok(Arc::new(Self { lib: lib.clone(), ptr, info, from_pd: Some(pd.clone()) }))
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    pub fn lib(&self) -> &Lib {
        &self.lib
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::doca_dev {
        self.ptr.as_ptr()
    }

    /// Whether host memory can be exported over PCIe from this device
    /// (`doca_mmap_cap_is_export_pci_supported`; the host side).
    pub fn can_export_pci(&self) -> Result<bool, Error> {
        let mut ok = 0u8;
        // SAFETY: a live devinfo; out-pointer to a local.
        check("doca_mmap_cap_is_export_pci_supported", unsafe {
            self.lib.common.doca_mmap_cap_is_export_pci_supported(self.devinfo(), &mut ok)
        })?;
        Ok(ok != 0)
    }

    /// Whether this device can import such exports
    /// (`doca_mmap_cap_is_create_from_export_pci_supported`; the DPU side).
    pub fn can_import_pci(&self) -> Result<bool, Error> {
        let mut ok = 0u8;
        // SAFETY: a live devinfo; out-pointer to a local.
        check("doca_mmap_cap_is_create_from_export_pci_supported", unsafe {
            self.lib.common.doca_mmap_cap_is_create_from_export_pci_supported(self.devinfo(), &mut ok)
        })?;
        Ok(ok != 0)
    }

    /// The device's DOCA-side `devinfo` (capability queries).
    pub(crate) fn devinfo(&self) -> *mut sys::doca_devinfo {
        // SAFETY: a live device.
        unsafe { self.lib.common.doca_dev_as_devinfo(self.ptr.as_ptr()) }
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: opened by us; every object made on it holds an Arc to us.
        let rc = unsafe { self.lib.common.doca_dev_close(self.ptr.as_ptr()) };
        if rc != sys::DOCA_SUCCESS {
            tracing::warn!(device = ?self.info, from_pd = self.from_pd.is_some(), error = %self.lib.common.error_name(rc), "doca_dev_close failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_normalisation() {
        assert_eq!(normal_pci("03:00.0"), "0000:03:00.0");
        assert_eq!(normal_pci("0000:3B:00.1"), "0000:3b:00.1");
    }

    #[test]
    fn c_string_stops_at_nul() {
        let buf: Vec<c_char> = b"mlx5_0\0junk".iter().map(|&b| b as c_char).collect();
        assert_eq!(c_string(&buf), "mlx5_0");
    }
}
