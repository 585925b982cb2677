//! AES-GCM on the DPU's crypto engine (`doca_aes_gcm`), memory to memory.
//!
//! DOCA's task layout (the AES-GCM guide and NVIDIA's samples): an encrypt
//! task reads `AAD || plaintext` from the source buffer and appends
//! `AAD || ciphertext || tag` to the destination; a decrypt task reads
//! `AAD || ciphertext || tag` and appends `AAD || plaintext`. The engine
//! stages both sides in DPU memory it registered once, so callers hand in
//! ordinary slices and get the same bytes `ring` would produce.

use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use doca_sys as sys;

use crate::device::Device;
use crate::engine::{allocated, user_data, Progress, Slot, Staging};
use crate::error::{check, Error};
use crate::mmap::{Access, Inventory};

/// GCM nonce and tag sizes Sluice uses (the object format's).
pub const IV_LEN: usize = 12;
pub const TAG_LEN: usize = 16;

/// Where the source and destination of one task go in the staging areas.
/// Pure arithmetic, so it is tested without DOCA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskLayout {
    pub aad: usize,
    /// Plaintext length (= ciphertext length).
    pub text: usize,
}

impl TaskLayout {
    pub fn encrypt_src_len(&self) -> usize {
        self.aad + self.text
    }

    pub fn encrypt_dst_len(&self) -> usize {
        self.aad + self.text + TAG_LEN
    }

    pub fn decrypt_src_len(&self) -> usize {
        self.encrypt_dst_len()
    }

    pub fn decrypt_dst_len(&self) -> usize {
        self.encrypt_src_len()
    }

    /// Where ciphertext (encrypt output) or plaintext (decrypt output)
    /// starts in the destination: after the copied AAD.
    pub fn text_in_dst(&self) -> std::ops::Range<usize> {
        self.aad..self.aad + self.text
    }

    pub fn tag_in_encrypt_dst(&self) -> std::ops::Range<usize> {
        self.aad + self.text..self.encrypt_dst_len()
    }
}

/// A key loaded into an engine's context. It keeps that context alive, is
/// used only with it (checked), and is destroyed under the engine's lock.
pub struct AesKey {
    engine: Arc<Mutex<Inner>>,
    ptr: NonNull<sys::doca_aes_gcm_key>,
}

// SAFETY: the handle is only used, and destroyed, under `engine`'s lock.
unsafe impl Send for AesKey {}
// SAFETY: as above.
unsafe impl Sync for AesKey {}

impl Drop for AesKey {
    fn drop(&mut self) {
        let g = self.engine.lock().unwrap_or_else(|p| p.into_inner());
        if g.progress.poisoned {
            // A task that timed out may still use this key: leaked, as the
            // task's buffers and the engine are (Progress::drop).
            return;
        }
        // SAFETY: made by doca_aes_gcm_key_create on this context, which our
        // Arc keeps alive; no task uses it (tasks complete within the call
        // that submits them, under the same lock, and after one timed out
        // the engine is poisoned and keys are leaked above).
        unsafe { g.progress.dev.lib().aes_gcm.doca_aes_gcm_key_destroy(self.ptr.as_ptr()) };
    }
}

/// AES-256-GCM tasks on one device, up to `max_text` bytes per call. A
/// cheap handle: clones share one DOCA context, and calls are serialised.
#[derive(Clone)]
pub struct AesGcmEngine {
    inner: Arc<Mutex<Inner>>,
}

impl AesGcmEngine {
    /// An engine for chunks of up to `max_text` bytes with up to `max_aad`
    /// bytes of associated data.
    pub fn new(dev: &Arc<Device>, max_text: usize, max_aad: usize) -> Result<Self, Error> {
        Ok(Self { inner: Arc::new(Mutex::new(Inner::new(dev, max_text, max_aad)?)) })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// False once a task hung: every later task fails, and the engine must
    /// be replaced (its keys with it).
    pub fn is_usable(&self) -> bool {
        !self.lock().progress.poisoned
    }

    fn own(&self, key: &AesKey) -> Result<(), Error> {
        if Arc::ptr_eq(&self.inner, &key.engine) {
            Ok(())
        } else {
            Err(Error::Invalid("an AES-GCM key of another engine".into()))
        }
    }

    /// Loads a 256-bit key.
    pub fn key(&self, raw: &[u8; 32]) -> Result<AesKey, Error> {
        let ptr = self.lock().key(raw)?;
        Ok(AesKey { engine: self.inner.clone(), ptr })
    }

    /// Encrypts `data` in place; returns the tag.
    pub fn seal(&self, key: &AesKey, iv: &[u8; IV_LEN], aad: &[u8], data: &mut [u8]) -> Result<[u8; TAG_LEN], Error> {
        self.own(key)?;
        self.lock().seal(key.ptr, iv, aad, data)
    }

    /// Checks `tag` and decrypts `data` in place. A mismatch is a task
    /// error; `data` is unchanged on any error.
    pub fn open(
        &self,
        key: &AesKey,
        iv: &[u8; IV_LEN],
        aad: &[u8],
        data: &mut [u8],
        tag: &[u8; TAG_LEN],
    ) -> Result<(), Error> {
        self.own(key)?;
        self.lock().open(key.ptr, iv, aad, data, tag)
    }
}

unsafe extern "C" fn noop_enc(_t: *mut sys::doca_aes_gcm_task_encrypt, ud: sys::doca_data, _c: sys::doca_data) {
    // SAFETY: the user data is the slot set by the submitting call.
    unsafe { crate::engine::finish_ok(ud) }
}
unsafe extern "C" fn fail_enc(_t: *mut sys::doca_aes_gcm_task_encrypt, ud: sys::doca_data, _c: sys::doca_data) {
    // SAFETY: as above.
    unsafe { crate::engine::finish_err(ud) }
}
unsafe extern "C" fn noop_dec(_t: *mut sys::doca_aes_gcm_task_decrypt, ud: sys::doca_data, _c: sys::doca_data) {
    // SAFETY: as above.
    unsafe { crate::engine::finish_ok(ud) }
}
unsafe extern "C" fn fail_dec(_t: *mut sys::doca_aes_gcm_task_decrypt, ud: sys::doca_data, _c: sys::doca_data) {
    // SAFETY: as above.
    unsafe { crate::engine::finish_err(ud) }
}

struct Inner {
    progress: Progress,
    ctx: NonNull<sys::doca_aes_gcm>,
    inv: Arc<Inventory>,
    src: Staging,
    dst: Staging,
    max_text: usize,
    max_aad: usize,
}

// SAFETY: every DOCA object here is used through &mut self only, i.e. under
// the engine's mutex.
unsafe impl Send for Inner {}

impl Inner {
    fn new(dev: &Arc<Device>, max_text: usize, max_aad: usize) -> Result<Self, Error> {
        let a = &dev.lib().aes_gcm;
        // SAFETY: a live devinfo.
        unsafe {
            check(
                "doca_aes_gcm_cap_task_encrypt_is_supported",
                a.doca_aes_gcm_cap_task_encrypt_is_supported(dev.devinfo()),
            )?;
            check(
                "doca_aes_gcm_cap_task_decrypt_is_supported",
                a.doca_aes_gcm_cap_task_decrypt_is_supported(dev.devinfo()),
            )?;
        }
        let cap = max_aad + max_text + TAG_LEN;
        let src = Staging::new(dev, cap, Access::LOCAL_READ_WRITE)?;
        let dst = Staging::new(dev, cap, Access::LOCAL_READ_WRITE)?;
        let inv = Inventory::new(dev, 4)?;
        let progress = Progress::new(dev)?;
        let mut ctx = std::ptr::null_mut();
        // SAFETY: a live device; out-pointer to a local.
        check("doca_aes_gcm_create", unsafe { a.doca_aes_gcm_create(dev.as_ptr(), &mut ctx) })?;
        let ctx = NonNull::new(ctx).ok_or(Error::Invalid("doca_aes_gcm_create returned NULL".into()))?;
        // Owned from here: Drop cleans up whatever the steps below did.
        let mut me = Self { progress, ctx, inv, src, dst, max_text, max_aad };
        // SAFETY: a fresh, idle context; callbacks match the C types.
        unsafe {
            check(
                "doca_aes_gcm_task_encrypt_set_conf",
                a.doca_aes_gcm_task_encrypt_set_conf(ctx.as_ptr(), Some(noop_enc), Some(fail_enc), 1),
            )?;
            check(
                "doca_aes_gcm_task_decrypt_set_conf",
                a.doca_aes_gcm_task_decrypt_set_conf(ctx.as_ptr(), Some(noop_dec), Some(fail_dec), 1),
            )?;
            me.progress.start(a.doca_aes_gcm_as_ctx(ctx.as_ptr()))?;
        }
        Ok(me)
    }

    fn key(&mut self, raw: &[u8; 32]) -> Result<NonNull<sys::doca_aes_gcm_key>, Error> {
        let lib = self.progress.dev.lib().clone();
        let mut k = std::ptr::null_mut();
        // SAFETY: a running context; DOCA copies the 32 key bytes.
        check("doca_aes_gcm_key_create", unsafe {
            lib.aes_gcm.doca_aes_gcm_key_create(
                self.ctx.as_ptr(),
                raw.as_ptr().cast(),
                sys::DOCA_AES_GCM_KEY_256,
                &mut k,
            )
        })?;
        NonNull::new(k).ok_or(Error::Invalid("doca_aes_gcm_key_create returned NULL".into()))
    }

    fn layout(&self, aad: &[u8], text: usize) -> Result<TaskLayout, Error> {
        if aad.len() > self.max_aad || text > self.max_text {
            return Err(Error::Invalid(format!(
                "AES-GCM task of {} AAD + {text} bytes exceeds this engine's {} + {}",
                aad.len(),
                self.max_aad,
                self.max_text
            )));
        }
        Ok(TaskLayout { aad: aad.len(), text })
    }

    fn seal(
        &mut self,
        key: NonNull<sys::doca_aes_gcm_key>,
        iv: &[u8; IV_LEN],
        aad: &[u8],
        data: &mut [u8],
    ) -> Result<[u8; TAG_LEN], Error> {
        let l = self.layout(aad, data.len())?;
        self.src.write(0, aad)?;
        self.src.write(l.aad, data)?;
        self.run(true, key, iv, l)?;
        self.dst.read(l.text_in_dst().start, data)?;
        let mut tag = [0u8; TAG_LEN];
        self.dst.read(l.tag_in_encrypt_dst().start, &mut tag)?;
        Ok(tag)
    }

    fn open(
        &mut self,
        key: NonNull<sys::doca_aes_gcm_key>,
        iv: &[u8; IV_LEN],
        aad: &[u8],
        data: &mut [u8],
        tag: &[u8; TAG_LEN],
    ) -> Result<(), Error> {
        let l = self.layout(aad, data.len())?;
        self.src.write(0, aad)?;
        self.src.write(l.aad, data)?;
        self.src.write(l.aad + l.text, tag)?;
        self.run(false, key, iv, l)?;
        self.dst.read(l.text_in_dst().start, data)
    }

    fn run(
        &mut self,
        encrypt: bool,
        key: NonNull<sys::doca_aes_gcm_key>,
        iv: &[u8; IV_LEN],
        l: TaskLayout,
    ) -> Result<(), Error> {
        let what = if encrypt { "AES-GCM encrypt" } else { "AES-GCM decrypt" };
        self.progress.check_usable(what)?;
        let (src_len, dst_cap) = if encrypt {
            (l.encrypt_src_len(), l.encrypt_dst_len())
        } else {
            (l.decrypt_src_len(), l.decrypt_dst_len())
        };
        let s = self.inv.buf(self.src.mmap(), 0, src_len.max(1), src_len)?;
        let d = self.inv.buf(self.dst.mmap(), 0, dst_cap.max(1), 0)?;
        let a = &self.progress.dev.lib().aes_gcm;
        let slot = Slot::new();
        let ud = user_data(slot);
        let task = if encrypt {
            let mut t = std::ptr::null_mut();
            // SAFETY: running context, live buffers and key; the IV is read
            // during the call; the slot outlives the task.
            let rc = unsafe {
                a.doca_aes_gcm_task_encrypt_alloc_init(
                    self.ctx.as_ptr(),
                    s.as_ptr(),
                    d.as_ptr(),
                    key.as_ptr(),
                    iv.as_ptr(),
                    IV_LEN as u32,
                    TAG_LEN as u32,
                    l.aad as u32,
                    ud,
                    &mut t,
                )
            };
            allocated("doca_aes_gcm_task_encrypt_alloc_init", rc, slot)?;
            // SAFETY: a live task.
            unsafe { a.doca_aes_gcm_task_encrypt_as_task(t) }
        } else {
            let mut t = std::ptr::null_mut();
            // SAFETY: as above.
            let rc = unsafe {
                a.doca_aes_gcm_task_decrypt_alloc_init(
                    self.ctx.as_ptr(),
                    s.as_ptr(),
                    d.as_ptr(),
                    key.as_ptr(),
                    iv.as_ptr(),
                    IV_LEN as u32,
                    TAG_LEN as u32,
                    l.aad as u32,
                    ud,
                    &mut t,
                )
            };
            allocated("doca_aes_gcm_task_decrypt_alloc_init", rc, slot)?;
            // SAFETY: a live task.
            unsafe { a.doca_aes_gcm_task_decrypt_as_task(t) }
        };
        let r = self.progress.run_task(what, task, slot);
        if matches!(r, Err(Error::TimedOut { .. })) {
            std::mem::forget((s, d));
            return r;
        }
        r?;
        let (_, produced) = d.data()?;
        if produced != dst_cap {
            return Err(Error::Invalid(format!("{what} produced {produced} bytes, expected {dst_cap}")));
        }
        Ok(())
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if self.progress.poisoned {
            return; // leaked on purpose: a task may still run (Progress::drop)
        }
        let a = &self.progress.dev.lib().aes_gcm;
        let c = &self.progress.dev.lib().common;
        // SAFETY: no task in flight; every key holds an Arc to us, so none
        // is left. Stop, then destroy; Progress::drop then destroys the
        // progress engine.
        unsafe {
            if !self.progress.ctx.is_null() {
                c.doca_ctx_stop(self.progress.ctx);
            }
            self.progress.ctx = std::ptr::null_mut();
            a.doca_aes_gcm_destroy(self.ctx.as_ptr());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_layout_puts_aad_first_and_the_tag_last() {
        let l = TaskLayout { aad: 37, text: 1000 };
        assert_eq!(l.encrypt_src_len(), 1037);
        assert_eq!(l.encrypt_dst_len(), 1053);
        assert_eq!(l.decrypt_src_len(), 1053);
        assert_eq!(l.decrypt_dst_len(), 1037);
        assert_eq!(l.text_in_dst(), 37..1037);
        assert_eq!(l.tag_in_encrypt_dst(), 1037..1053);
        let empty = TaskLayout { aad: 37, text: 0 };
        assert_eq!(empty.tag_in_encrypt_dst(), 37..53);
    }
}
