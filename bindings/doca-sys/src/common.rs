//! `libdoca_common`: DOCA Core — devices, memory maps, buffers, the progress
//! engine, contexts and tasks, error names, and the RDMA bridge to verbs.
//!
//! Signatures transcribed from the DOCA 3.0 API reference (doca_error.h,
//! doca_dev.h, doca_mmap.h, doca_buf.h, doca_buf_inventory.h, doca_pe.h,
//! doca_ctx.h, doca_rdma_bridge.h). The RDMA bridge is placed here because
//! the reference files it under "DOCA Core"; that placement, like every
//! signature, is unverified against a real installation until
//! `--features bindgen-check` runs on a DOCA machine (docs/doca.md). A wrong
//! library shows up as `SymbolMissing` at load time, not as a bad call.

use core::ffi::{c_char, c_int, c_void};

use crate::loader::doca_library;
use crate::types::*;

doca_library! {
    /// The functions of `libdoca_common.so`.
    pub struct Common in "doca_common" {
        // --- errors (doca_error.h)
        /// Static string with the code's name, e.g. "DOCA_ERROR_NOT_FOUND".
        fn doca_error_get_name(error: doca_error_t) -> *const c_char;
        /// Static string describing the code.
        fn doca_error_get_descr(error: doca_error_t) -> *const c_char;

        // --- devices (doca_dev.h)
        /// Lists the local devices; free with `doca_devinfo_destroy_list`.
        fn doca_devinfo_create_list(dev_list: *mut *mut *mut doca_devinfo, nb_devs: *mut u32) -> doca_error_t;
        fn doca_devinfo_destroy_list(dev_list: *mut *mut doca_devinfo) -> doca_error_t;
        /// `pci_addr_str` must hold `DOCA_DEVINFO_PCI_ADDR_SIZE` bytes.
        fn doca_devinfo_get_pci_addr_str(devinfo: *const doca_devinfo, pci_addr_str: *mut c_char) -> doca_error_t;
        fn doca_devinfo_is_equal_pci_addr(
            devinfo: *const doca_devinfo,
            pci_addr_str: *const c_char,
            is_equal: *mut u8,
        ) -> doca_error_t;
        fn doca_devinfo_get_ibdev_name(devinfo: *const doca_devinfo, ibdev_name: *mut c_char, size: u32) -> doca_error_t;
        fn doca_dev_open(devinfo: *mut doca_devinfo, dev: *mut *mut doca_dev) -> doca_error_t;
        fn doca_dev_close(dev: *mut doca_dev) -> doca_error_t;
        fn doca_dev_as_devinfo(dev: *const doca_dev) -> *mut doca_devinfo;
        /// DPU side: the representors of the host functions (`filter`: `DOCA_DEVINFO_REP_FILTER_*`).
        fn doca_devinfo_rep_create_list(
            dev: *mut doca_dev,
            filter: c_int,
            dev_list_rep: *mut *mut *mut doca_devinfo_rep,
            nb_devs_rep: *mut u32,
        ) -> doca_error_t;
        fn doca_devinfo_rep_destroy_list(dev_list_rep: *mut *mut doca_devinfo_rep) -> doca_error_t;
        fn doca_devinfo_rep_get_pci_addr_str(devinfo_rep: *const doca_devinfo_rep, pci_addr_str: *mut c_char) -> doca_error_t;
        fn doca_devinfo_rep_get_pci_func_type(
            devinfo_rep: *const doca_devinfo_rep,
            pci_func_type: *mut doca_pci_func_type,
        ) -> doca_error_t;
        fn doca_dev_rep_open(devinfo: *mut doca_devinfo_rep, dev_rep: *mut *mut doca_dev_rep) -> doca_error_t;
        fn doca_dev_rep_close(dev: *mut doca_dev_rep) -> doca_error_t;

        // --- memory maps (doca_mmap.h)
        fn doca_mmap_create(mmap: *mut *mut doca_mmap) -> doca_error_t;
        fn doca_mmap_destroy(mmap: *mut doca_mmap) -> doca_error_t;
        fn doca_mmap_start(mmap: *mut doca_mmap) -> doca_error_t;
        fn doca_mmap_stop(mmap: *mut doca_mmap) -> doca_error_t;
        fn doca_mmap_add_dev(mmap: *mut doca_mmap, dev: *mut doca_dev) -> doca_error_t;
        fn doca_mmap_rm_dev(mmap: *mut doca_mmap, dev: *mut doca_dev) -> doca_error_t;
        fn doca_mmap_set_memrange(mmap: *mut doca_mmap, addr: *mut c_void, len: usize) -> doca_error_t;
        /// GPU memory: a dma-buf fd (from `cuMemGetHandleForAddressRange`).
        fn doca_mmap_set_dmabuf_memrange(
            mmap: *mut doca_mmap,
            dmabuf_fd: c_int,
            addr: *mut c_void,
            dmabuf_offset: usize,
            len: usize,
        ) -> doca_error_t;
        fn doca_mmap_get_memrange(mmap: *const doca_mmap, addr: *mut *mut c_void, len: *mut usize) -> doca_error_t;
        /// `access_mask`: `DOCA_ACCESS_FLAG_*` bits.
        fn doca_mmap_set_permissions(mmap: *mut doca_mmap, access_mask: u32) -> doca_error_t;
        fn doca_mmap_set_max_num_devices(mmap: *mut doca_mmap, max_num_devices: u32) -> doca_error_t;
        /// Host side: a descriptor the DPU imports with `doca_mmap_create_from_export`.
        /// The descriptor stays owned by the mmap.
        fn doca_mmap_export_pci(
            mmap: *mut doca_mmap,
            dev: *const doca_dev,
            export_desc: *mut *const c_void,
            export_desc_len: *mut usize,
        ) -> doca_error_t;
        /// A descriptor a remote RDMA peer can use (re-export of an imported host mmap).
        fn doca_mmap_export_rdma(
            mmap: *mut doca_mmap,
            dev: *const doca_dev,
            export_desc: *mut *const c_void,
            export_desc_len: *mut usize,
        ) -> doca_error_t;
        fn doca_mmap_create_from_export(
            user_data: *const doca_data,
            export_desc: *const c_void,
            export_desc_len: usize,
            dev: *mut doca_dev,
            mmap: *mut *mut doca_mmap,
        ) -> doca_error_t;
        fn doca_mmap_cap_is_export_pci_supported(devinfo: *const doca_devinfo, mmap_export: *mut u8) -> doca_error_t;
        fn doca_mmap_cap_is_create_from_export_pci_supported(
            devinfo: *const doca_devinfo,
            from_export: *mut u8,
        ) -> doca_error_t;

        // --- buffers (doca_buf_inventory.h, doca_buf.h)
        fn doca_buf_inventory_create(num_elements: usize, inventory: *mut *mut doca_buf_inventory) -> doca_error_t;
        fn doca_buf_inventory_destroy(inventory: *mut doca_buf_inventory) -> doca_error_t;
        fn doca_buf_inventory_start(inventory: *mut doca_buf_inventory) -> doca_error_t;
        fn doca_buf_inventory_stop(inventory: *mut doca_buf_inventory) -> doca_error_t;
        /// The exported function behind the header's inline
        /// `doca_buf_inventory_buf_get_by_addr` / `_by_data` (see the methods below).
        fn doca_buf_inventory_buf_get_by_args(
            inventory: *mut doca_buf_inventory,
            mmap: *mut doca_mmap,
            addr: *mut c_void,
            len: usize,
            data: *mut c_void,
            data_len: usize,
            buf: *mut *mut doca_buf,
        ) -> doca_error_t;
        fn doca_buf_inc_refcount(buf: *mut doca_buf, refcount: *mut u16) -> doca_error_t;
        /// Returns the buffer to its inventory when the count reaches zero.
        fn doca_buf_dec_refcount(buf: *mut doca_buf, refcount: *mut u16) -> doca_error_t;
        fn doca_buf_get_len(buf: *const doca_buf, len: *mut usize) -> doca_error_t;
        fn doca_buf_get_head(buf: *const doca_buf, head: *mut *mut c_void) -> doca_error_t;
        fn doca_buf_get_data(buf: *const doca_buf, data: *mut *mut c_void) -> doca_error_t;
        fn doca_buf_get_data_len(buf: *const doca_buf, data_len: *mut usize) -> doca_error_t;
        fn doca_buf_set_data(buf: *mut doca_buf, data: *mut c_void, data_len: usize) -> doca_error_t;

        // --- progress engine and tasks (doca_pe.h)
        fn doca_pe_create(pe: *mut *mut doca_pe) -> doca_error_t;
        fn doca_pe_destroy(pe: *mut doca_pe) -> doca_error_t;
        /// Runs completion callbacks; non-zero if it made progress.
        fn doca_pe_progress(pe: *mut doca_pe) -> u8;
        fn doca_pe_connect_ctx(pe: *mut doca_pe, ctx: *mut doca_ctx) -> doca_error_t;
        fn doca_pe_get_num_inflight_tasks(pe: *const doca_pe, num_inflight_tasks: *mut usize) -> doca_error_t;
        /// Linux: an fd that becomes readable after `doca_pe_request_notification`
        /// (for an async runtime's reactor).
        fn doca_pe_get_notification_handle(pe: *const doca_pe, handle: *mut doca_notification_handle_t) -> doca_error_t;
        fn doca_pe_request_notification(pe: *mut doca_pe) -> doca_error_t;
        fn doca_pe_clear_notification(pe: *mut doca_pe, handle: doca_notification_handle_t) -> doca_error_t;
        fn doca_task_submit(task: *mut doca_task) -> doca_error_t;
        fn doca_task_try_submit(task: *mut doca_task) -> doca_error_t;
        fn doca_task_free(task: *mut doca_task);
        fn doca_task_get_status(task: *const doca_task) -> doca_error_t;
        fn doca_task_set_user_data(task: *mut doca_task, user_data: doca_data);
        fn doca_task_get_user_data(task: *const doca_task) -> doca_data;

        // --- contexts (doca_ctx.h)
        fn doca_ctx_start(ctx: *mut doca_ctx) -> doca_error_t;
        fn doca_ctx_stop(ctx: *mut doca_ctx) -> doca_error_t;
        fn doca_ctx_get_state(ctx: *const doca_ctx, state: *mut doca_ctx_states) -> doca_error_t;
        fn doca_ctx_set_user_data(ctx: *mut doca_ctx, user_data: doca_data) -> doca_error_t;
        fn doca_ctx_get_num_inflight_tasks(ctx: *const doca_ctx, num_inflight_tasks: *mut usize) -> doca_error_t;
        fn doca_ctx_set_state_changed_cb(ctx: *mut doca_ctx, cb: doca_ctx_state_changed_callback_t) -> doca_error_t;

        // --- RDMA bridge to verbs (doca_rdma_bridge.h)
        /// The verbs protection domain behind `dev` (owned by the device).
        fn doca_rdma_bridge_get_dev_pd(dev: *const doca_dev, pd: *mut *mut ibv_pd) -> doca_error_t;
        /// A DOCA device over an existing verbs PD.
        fn doca_rdma_bridge_open_dev_from_pd(pd: *mut ibv_pd, dev: *mut *mut doca_dev) -> doca_error_t;
        fn doca_rdma_bridge_get_buf_mkey(buf: *const doca_buf, dev: *mut doca_dev, mkey: *mut u32) -> doca_error_t;
    }
}

impl Common {
    /// The header's `static inline doca_buf_inventory_buf_get_by_addr`: a
    /// buffer over `[addr, addr + len)` with empty data.
    ///
    /// # Safety
    /// As `doca_buf_inventory_buf_get_by_args`: live, started inventory and
    /// mmap; the range lies inside the mmap.
    pub unsafe fn doca_buf_inventory_buf_get_by_addr(
        &self,
        inventory: *mut doca_buf_inventory,
        mmap: *mut doca_mmap,
        addr: *mut c_void,
        len: usize,
        buf: *mut *mut doca_buf,
    ) -> doca_error_t {
        // SAFETY: forwarded contract; same arguments as the C inline function.
        unsafe { self.doca_buf_inventory_buf_get_by_args(inventory, mmap, addr, len, addr, 0, buf) }
    }

    /// The header's `static inline doca_buf_inventory_buf_get_by_data`: a
    /// buffer over `[data, data + data_len)` whose data is the whole range.
    ///
    /// # Safety
    /// As [`Common::doca_buf_inventory_buf_get_by_addr`].
    pub unsafe fn doca_buf_inventory_buf_get_by_data(
        &self,
        inventory: *mut doca_buf_inventory,
        mmap: *mut doca_mmap,
        data: *mut c_void,
        data_len: usize,
        buf: *mut *mut doca_buf,
    ) -> doca_error_t {
        // SAFETY: forwarded contract; same arguments as the C inline function.
        unsafe { self.doca_buf_inventory_buf_get_by_args(inventory, mmap, data, data_len, data, data_len, buf) }
    }

    /// DOCA's own name for `code` (`doca_error_get_name`); the library may know
    /// codes newer than [`crate::DocaErrorCode`].
    pub fn error_name(&self, code: doca_error_t) -> String {
        // SAFETY: doca_error_get_name takes any value and returns a pointer to
        // a static NUL-terminated string (or NULL, handled below).
        let p = unsafe { self.doca_error_get_name(code) };
        if p.is_null() {
            return format!("DOCA error {code}");
        }
        // SAFETY: non-null, NUL-terminated, static storage (see above).
        unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}
