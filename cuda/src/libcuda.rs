//! `libcuda.so.1`, opened at run time: hand-written declarations of the
//! driver API calls Sluice makes (transcribed from the CUDA Driver API
//! reference, cuda.h of CUDA 12/13), resolved with `dlsym`.
//!
//! Nothing links CUDA at build time, so the workspace builds and runs where
//! there is no NVIDIA driver; there [`LibCuda::load`] says so
//! ([`CudaError::NoDriver`]). Only the driver API is used (no runtime, no
//! toolkit), so it works beside torch, cupy or anything else in-process,
//! sharing their primary contexts.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CStr, OsStr, OsString};
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Mutex;

use libloading::os::unix::{Library as UnixLibrary, RTLD_LOCAL, RTLD_NOW};
use libloading::Library;

use crate::driver::{
    Attribute, DevicePtr, Driver, MemoryType, PointerInfo, RawEvent, RawStream, CUDA_ERROR_INVALID_CONTEXT,
    CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_NOT_READY, CUDA_SUCCESS, POINTER_ATTRIBUTE_DEVICE_ORDINAL,
    POINTER_ATTRIBUTE_MEMORY_TYPE,
};
use crate::CudaError;

/// Environment variable naming the driver library to load.
pub const LIBCUDA_ENV: &str = "SLUICE_LIBCUDA";
/// The driver's soname (what the NVIDIA driver package installs).
pub const DEFAULT_LIBCUDA: &str = "libcuda.so.1";

type CUresult = c_int;
type CUdevice = c_int;
type CUcontext = *mut c_void;
type CUstream = *mut c_void;
type CUevent = *mut c_void;

/// `CU_MEMHOSTREGISTER_PORTABLE`: pinned for every context of the process.
const HOST_REGISTER_PORTABLE: c_uint = 0x1;
/// `CU_STREAM_NON_BLOCKING`: no implicit sync with the legacy default stream.
const STREAM_NON_BLOCKING: c_uint = 0x1;
/// `CU_EVENT_DISABLE_TIMING`: the cheapest event, for ordering only.
const EVENT_DISABLE_TIMING: c_uint = 0x2;
/// `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD`.
const MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD: c_int = 0x1;

/// Declares the driver calls: one optional function pointer per symbol,
/// resolved at load; a symbol the driver lacks fails only the call that
/// needs it ([`CudaError::MissingSymbol`]), so an older driver still does
/// what it can.
macro_rules! cuda_api {
    ($(fn $name:ident($($ty:ty),* $(,)?);)*) => {
        #[allow(non_snake_case)]
        struct Api {
            $($name: Option<unsafe extern "C" fn($($ty),*) -> CUresult>,)*
        }

        impl Api {
            fn resolve(lib: &Library) -> Self {
                Self {
                    $(
                        // SAFETY: the declared type is the C signature of the
                        // symbol in cuda.h; the pointer is copied out and used
                        // only while `LibCuda` keeps `lib` loaded.
                        $name: unsafe { lib.get::<unsafe extern "C" fn($($ty),*) -> CUresult>(concat!(stringify!($name), "\0").as_bytes()) }
                            .ok()
                            .map(|s| *s),
                    )*
                }
            }
        }
    };
}

cuda_api! {
    fn cuInit(c_uint);
    fn cuGetErrorName(CUresult, *mut *const c_char);
    fn cuDeviceGetCount(*mut c_int);
    fn cuDeviceGet(*mut CUdevice, c_int);
    fn cuDeviceGetName(*mut c_char, c_int, CUdevice);
    fn cuDeviceGetAttribute(*mut c_int, c_int, CUdevice);
    fn cuDevicePrimaryCtxRetain(*mut CUcontext, CUdevice);
    fn cuDevicePrimaryCtxRelease_v2(CUdevice);
    fn cuDevicePrimaryCtxGetState(CUdevice, *mut c_uint, *mut c_int);
    fn cuCtxSetCurrent(CUcontext);
    fn cuPointerGetAttribute(*mut c_void, c_int, DevicePtr);
    fn cuMemGetAddressRange_v2(*mut DevicePtr, *mut usize, DevicePtr);
    fn cuMemAlloc_v2(*mut DevicePtr, usize);
    fn cuMemFree_v2(DevicePtr);
    fn cuMemHostRegister_v2(*mut c_void, usize, c_uint);
    fn cuMemHostUnregister(*mut c_void);
    fn cuStreamCreate(*mut CUstream, c_uint);
    fn cuStreamDestroy_v2(CUstream);
    fn cuStreamSynchronize(CUstream);
    fn cuEventCreate(*mut CUevent, c_uint);
    fn cuEventDestroy_v2(CUevent);
    fn cuEventRecord(CUevent, CUstream);
    fn cuEventQuery(CUevent);
    fn cuEventSynchronize(CUevent);
    fn cuMemcpyHtoDAsync_v2(DevicePtr, *const c_void, usize, CUstream);
    fn cuMemcpyDtoHAsync_v2(*mut c_void, DevicePtr, usize, CUstream);
    fn cuMemGetHandleForAddressRange(*mut c_void, DevicePtr, usize, c_int, c_ulonglong);
}

/// Calls a declared function: `MissingSymbol` if the driver lacks it,
/// `Call` with the error's name if it fails. The invocation site's
/// `// SAFETY:` comment argues for the arguments.
macro_rules! cu {
    ($self:ident . $name:ident ( $($arg:expr),* $(,)? )) => {
        match $self.api.$name {
            None => Err(CudaError::MissingSymbol { path: $self.path.clone(), symbol: stringify!($name) }),
            Some(f) => {
                // SAFETY: `f` has the C signature of the symbol (see
                // `cuda_api!`) and the library stays loaded while `self`
                // lives; the caller's SAFETY comment covers the arguments.
                let rc = unsafe { f($($arg),*) };
                $self.check(stringify!($name), rc)
            }
        }
    };
}

/// The NVIDIA driver library.
pub struct LibCuda {
    api: Api,
    path: String,
    /// Retained primary contexts by device ordinal (`CUcontext` as an
    /// address: the handle is process-wide and thread-safe in CUDA).
    contexts: Mutex<HashMap<u32, (CUdevice, usize)>>,
    // Keeps the library mapped while the pointers in `api` exist.
    _lib: Library,
}

impl std::fmt::Debug for LibCuda {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LibCuda").field("path", &self.path).finish_non_exhaustive()
    }
}

/// The library to open: `$SLUICE_LIBCUDA` if set and not empty, else the soname.
pub fn default_path() -> OsString {
    match std::env::var_os(LIBCUDA_ENV) {
        Some(p) if !p.is_empty() => p,
        _ => OsString::from(DEFAULT_LIBCUDA),
    }
}

impl LibCuda {
    /// Opens [`default_path`] and initialises the driver (`cuInit`).
    pub fn load() -> Result<Self, CudaError> {
        Self::load_from(&default_path())
    }

    /// Opens the driver at `path` (a soname or a file) and calls `cuInit`.
    pub fn load_from(path: &OsStr) -> Result<Self, CudaError> {
        Self::open(path, RTLD_NOW | RTLD_LOCAL)
    }

    /// The driver only if this process has loaded it already (someone here
    /// uses CUDA): `dlopen` with `RTLD_NOLOAD` never maps a library, so a
    /// process without CUDA stays without it. `None` otherwise.
    pub fn load_if_in_use(path: &OsStr) -> Result<Option<Self>, CudaError> {
        match Self::open(path, RTLD_NOW | RTLD_LOCAL | libc::RTLD_NOLOAD) {
            Err(CudaError::NoDriver { .. }) => Ok(None),
            other => other.map(Some),
        }
    }

    fn open(path: &OsStr, flags: c_int) -> Result<Self, CudaError> {
        let shown = path.to_string_lossy().into_owned();
        // SAFETY: loading libcuda runs its ELF constructors, which have no
        // preconditions on the caller (every CUDA application does this);
        // the library is used only through the declarations above.
        let lib = unsafe { UnixLibrary::open(Some(path), flags) }
            .map_err(|e| CudaError::NoDriver { path: shown.clone(), reason: e.to_string() })?;
        let lib: Library = lib.into();
        let me = Self { api: Api::resolve(&lib), path: shown.clone(), contexts: Mutex::default(), _lib: lib };
        if me.api.cuInit.is_none() {
            return Err(CudaError::NoDriver { path: shown, reason: "it has no cuInit: not a CUDA driver".into() });
        }
        // SAFETY: cuInit takes flags only (0 is the one defined value).
        cu!(me.cuInit(0))?;
        Ok(me)
    }

    fn check(&self, call: &'static str, rc: CUresult) -> Result<(), CudaError> {
        if rc == CUDA_SUCCESS {
            return Ok(());
        }
        Err(CudaError::Call { call, code: rc, name: self.error_name(rc) })
    }

    fn error_name(&self, rc: CUresult) -> String {
        let mut s: *const c_char = std::ptr::null();
        let Some(f) = self.api.cuGetErrorName else { return "CUDA error".into() };
        // SAFETY: `s` is a valid out-pointer; the driver sets it to a static
        // string (or leaves it null for an unknown code).
        let rc2 = unsafe { f(rc, &mut s) };
        if rc2 != CUDA_SUCCESS || s.is_null() {
            return "CUDA error".into();
        }
        // SAFETY: a non-null result is a NUL-terminated static string.
        unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
    }

    fn device(&self, ordinal: u32) -> Result<CUdevice, CudaError> {
        let mut d: CUdevice = 0;
        let ord = c_int::try_from(ordinal).map_err(|_| CudaError::NoDevice { device: ordinal, count: 0 })?;
        // SAFETY: `d` is a valid out-pointer.
        match cu!(self.cuDeviceGet(&mut d, ord)) {
            Err(CudaError::Call { code: CUDA_ERROR_INVALID_DEVICE, .. }) => {
                Err(CudaError::NoDevice { device: ordinal, count: self.device_count().unwrap_or(0) })
            }
            other => other.map(|()| d),
        }
    }

    fn pointer_attribute<T: Default>(&self, attr: c_int, ptr: DevicePtr) -> Result<T, CudaError> {
        let mut v = T::default();
        // SAFETY: `v` is a valid out-pointer of the type the attribute
        // writes (u32 for MEMORY_TYPE, int for DEVICE_ORDINAL: callers pick T).
        cu!(self.cuPointerGetAttribute((&mut v as *mut T).cast(), attr, ptr))?;
        Ok(v)
    }
}

impl Drop for LibCuda {
    fn drop(&mut self) {
        let ctxs = std::mem::take(self.contexts.get_mut().unwrap_or_else(|p| p.into_inner()));
        for (_, (dev, _)) in ctxs {
            // SAFETY: each entry was retained once by `use_device`; every
            // object made in it (streams, events, pins) holds this driver,
            // so none outlives the release.
            let _ = cu!(self.cuDevicePrimaryCtxRelease_v2(dev));
        }
    }
}

impl Driver for LibCuda {
    fn name(&self) -> &str {
        "cuda"
    }

    fn path(&self) -> &str {
        &self.path
    }

    fn device_count(&self) -> Result<u32, CudaError> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid out-pointer.
        cu!(self.cuDeviceGetCount(&mut n))?;
        Ok(u32::try_from(n).unwrap_or(0))
    }

    fn device_name(&self, device: u32) -> Result<String, CudaError> {
        let d = self.device(device)?;
        let mut buf = [0 as c_char; 256];
        // SAFETY: the driver writes at most `len` bytes, NUL-terminated.
        cu!(self.cuDeviceGetName(buf.as_mut_ptr(), buf.len() as c_int, d))?;
        // SAFETY: the buffer is NUL-terminated (zero-filled, and the driver
        // terminates what it writes within `len`).
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned())
    }

    fn attribute(&self, device: u32, attr: Attribute) -> Result<i32, CudaError> {
        let d = self.device(device)?;
        let mut v: c_int = 0;
        // SAFETY: `v` is a valid out-pointer; the attribute is a defined value.
        cu!(self.cuDeviceGetAttribute(&mut v, attr as c_int, d))?;
        Ok(v)
    }

    fn context_active(&self, device: u32) -> Result<bool, CudaError> {
        let d = self.device(device)?;
        let (mut flags, mut active): (c_uint, c_int) = (0, 0);
        // SAFETY: both are valid out-pointers.
        cu!(self.cuDevicePrimaryCtxGetState(d, &mut flags, &mut active))?;
        Ok(active != 0)
    }

    fn use_device(&self, device: u32) -> Result<(), CudaError> {
        let ctx = {
            let mut map = self.contexts.lock().unwrap_or_else(|p| p.into_inner());
            match map.get(&device) {
                Some((_, c)) => *c,
                None => {
                    let d = self.device(device)?;
                    let mut c: CUcontext = std::ptr::null_mut();
                    // SAFETY: `c` is a valid out-pointer; the retain is
                    // balanced by the release in Drop.
                    cu!(self.cuDevicePrimaryCtxRetain(&mut c, d))?;
                    map.insert(device, (d, c as usize));
                    c as usize
                }
            }
        };
        // SAFETY: `ctx` is a primary context retained above and not yet released.
        cu!(self.cuCtxSetCurrent(ctx as CUcontext))
    }

    fn pointer_info(&self, ptr: DevicePtr) -> Result<PointerInfo, CudaError> {
        let not_ours = |e: CudaError| CudaError::NotDeviceMemory { ptr, reason: e.to_string() };
        // Pointer attributes need some context current on a thread that may
        // never have used CUDA (a runtime worker): fall back to device 0's.
        let mtype: u32 = match self.pointer_attribute(POINTER_ATTRIBUTE_MEMORY_TYPE, ptr) {
            Err(CudaError::Call { code: CUDA_ERROR_INVALID_CONTEXT, .. }) => {
                self.use_device(0)?;
                self.pointer_attribute(POINTER_ATTRIBUTE_MEMORY_TYPE, ptr).map_err(not_ours)?
            }
            other => other.map_err(not_ours)?,
        };
        let memory_type = MemoryType::from_raw(mtype);
        if memory_type == MemoryType::Host {
            return Ok(PointerInfo { memory_type, device: 0, base: ptr, size: 0 });
        }
        let ordinal: c_int = self.pointer_attribute(POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr).map_err(not_ours)?;
        let device = u32::try_from(ordinal)
            .map_err(|_| CudaError::NotDeviceMemory { ptr, reason: format!("device ordinal {ordinal}") })?;
        self.use_device(device)?;
        let (mut base, mut size): (DevicePtr, usize) = (0, 0);
        // SAFETY: both are valid out-pointers.
        cu!(self.cuMemGetAddressRange_v2(&mut base, &mut size, ptr)).map_err(not_ours)?;
        Ok(PointerInfo { memory_type, device, base, size: size as u64 })
    }

    fn mem_alloc(&self, len: usize) -> Result<DevicePtr, CudaError> {
        let mut p: DevicePtr = 0;
        // SAFETY: `p` is a valid out-pointer.
        cu!(self.cuMemAlloc_v2(&mut p, len))?;
        Ok(p)
    }

    unsafe fn mem_free(&self, ptr: DevicePtr) -> Result<(), CudaError> {
        // SAFETY: the caller passes an allocation of ours, freed once.
        cu!(self.cuMemFree_v2(ptr))
    }

    unsafe fn host_register(&self, addr: *mut u8, len: usize) -> Result<(), CudaError> {
        // SAFETY: the caller guarantees the range stays mapped until unregistered.
        cu!(self.cuMemHostRegister_v2(addr.cast(), len, HOST_REGISTER_PORTABLE))
    }

    unsafe fn host_unregister(&self, addr: *mut u8) -> Result<(), CudaError> {
        // SAFETY: the caller guarantees no queued copy uses the range.
        cu!(self.cuMemHostUnregister(addr.cast()))
    }

    fn stream_create(&self) -> Result<RawStream, CudaError> {
        let mut s: CUstream = std::ptr::null_mut();
        // SAFETY: `s` is a valid out-pointer.
        cu!(self.cuStreamCreate(&mut s, STREAM_NON_BLOCKING))?;
        Ok(RawStream(s as usize))
    }

    unsafe fn stream_destroy(&self, stream: RawStream) -> Result<(), CudaError> {
        // SAFETY: the caller passes a live stream of ours, destroyed once.
        cu!(self.cuStreamDestroy_v2(stream.0 as CUstream))
    }

    unsafe fn stream_synchronize(&self, stream: RawStream) -> Result<(), CudaError> {
        // SAFETY: the caller passes a live stream of ours.
        cu!(self.cuStreamSynchronize(stream.0 as CUstream))
    }

    fn event_create(&self) -> Result<RawEvent, CudaError> {
        let mut e: CUevent = std::ptr::null_mut();
        // SAFETY: `e` is a valid out-pointer.
        cu!(self.cuEventCreate(&mut e, EVENT_DISABLE_TIMING))?;
        Ok(RawEvent(e as usize))
    }

    unsafe fn event_destroy(&self, event: RawEvent) -> Result<(), CudaError> {
        // SAFETY: the caller passes a live event of ours, destroyed once.
        cu!(self.cuEventDestroy_v2(event.0 as CUevent))
    }

    unsafe fn event_record(&self, event: RawEvent, stream: RawStream) -> Result<(), CudaError> {
        // SAFETY: the caller passes live handles of ours.
        cu!(self.cuEventRecord(event.0 as CUevent, stream.0 as CUstream))
    }

    unsafe fn event_query(&self, event: RawEvent) -> Result<bool, CudaError> {
        // SAFETY: the caller passes a live event of ours.
        match cu!(self.cuEventQuery(event.0 as CUevent)) {
            Ok(()) => Ok(true),
            Err(CudaError::Call { code: CUDA_ERROR_NOT_READY, .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    unsafe fn event_synchronize(&self, event: RawEvent) -> Result<(), CudaError> {
        // SAFETY: the caller passes a live event of ours.
        cu!(self.cuEventSynchronize(event.0 as CUevent))
    }

    unsafe fn memcpy_htod_async(
        &self,
        dst: DevicePtr,
        src: *const u8,
        len: usize,
        stream: RawStream,
    ) -> Result<(), CudaError> {
        // SAFETY: the caller keeps `src` readable until the stream passes
        // the copy, and `dst`/`stream` are live.
        cu!(self.cuMemcpyHtoDAsync_v2(dst, src.cast(), len, stream.0 as CUstream))
    }

    unsafe fn memcpy_dtoh_async(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        len: usize,
        stream: RawStream,
    ) -> Result<(), CudaError> {
        // SAFETY: the caller keeps `dst` writable and otherwise unused until
        // the stream passes the copy, and `src`/`stream` are live.
        cu!(self.cuMemcpyDtoHAsync_v2(dst.cast(), src, len, stream.0 as CUstream))
    }

    fn dmabuf_fd(&self, ptr: DevicePtr, len: usize) -> Result<OwnedFd, CudaError> {
        let mut fd: c_int = -1;
        // SAFETY: the handle out-pointer is an int, as the DMA_BUF_FD type
        // requires; the driver validates `ptr`/`len` itself.
        cu!(self.cuMemGetHandleForAddressRange(
            (&mut fd as *mut c_int).cast(),
            ptr,
            len,
            MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
            0
        ))?;
        if fd < 0 {
            return Err(CudaError::Call { call: "cuMemGetHandleForAddressRange", code: -1, name: "no fd".into() });
        }
        // SAFETY: the driver returned a new descriptor that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_driver_is_no_driver_naming_the_path() {
        let e = LibCuda::load_from(OsStr::new("/nonexistent/libcuda.so.1")).map(|_| ()).expect_err("no such file");
        assert!(matches!(&e, CudaError::NoDriver { path, .. } if path == "/nonexistent/libcuda.so.1"), "{e:?}");
        let msg = e.to_string();
        assert!(msg.starts_with("no CUDA driver: /nonexistent/libcuda.so.1"), "{msg}");
        assert!(msg.contains("GPU memory is unavailable"), "{msg}");
        assert!(e.is_unavailable() && !e.is_bad_request());
        // Not loaded in this process: nothing is loaded, nothing fails.
        assert!(LibCuda::load_if_in_use(OsStr::new("/nonexistent/libcuda.so.1")).expect("no error").is_none());
    }

    #[test]
    fn a_library_that_is_not_the_driver_is_refused() {
        // libc is loaded in every process and has no cuInit.
        let e = LibCuda::load_from(OsStr::new("libc.so.6")).map(|_| ()).expect_err("libc is no CUDA driver");
        assert!(e.to_string().contains("no cuInit"), "{e}");
    }

    /// On a machine without the NVIDIA driver (CI, the dev machines) the
    /// default load fails with the clear error; on a GPU machine set
    /// SLUICE_TEST_CUDA=1 and it must load and see a device. Never both
    /// ways: a driver that appears unannounced fails the test too.
    #[test]
    fn the_default_driver_matches_what_this_machine_has() {
        let expect_gpu = std::env::var("SLUICE_TEST_CUDA").is_ok_and(|v| v == "1");
        match LibCuda::load() {
            Ok(d) if expect_gpu => {
                let n = d.device_count().expect("cuDeviceGetCount");
                assert!(n > 0, "SLUICE_TEST_CUDA=1 but the driver sees no GPU");
                assert!(!d.device_name(0).expect("name").is_empty());
            }
            Ok(d) => panic!("a CUDA driver loaded from {} but SLUICE_TEST_CUDA=1 is not set: set it here", d.path()),
            Err(e) if expect_gpu => panic!("SLUICE_TEST_CUDA=1 but {e}"),
            Err(e) => {
                assert!(matches!(e, CudaError::NoDriver { .. }), "{e:?}");
                assert!(e.to_string().starts_with("no CUDA driver"), "{e}");
            }
        }
    }
}
