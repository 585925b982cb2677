//! `libdoca_dma`: DMA memcpy tasks (DPU memory <-> host memory imported with
//! `doca_mmap_create_from_export`).
//!
//! Signatures transcribed from the DOCA 3.0 API reference (doca_dma.h);
//! unverified against headers until `--features bindgen-check` runs on a DOCA
//! machine (docs/doca.md).

use crate::loader::doca_library;
use crate::types::*;

doca_library! {
    /// The functions of `libdoca_dma.so`.
    pub struct Dma in "doca_dma" {
        fn doca_dma_create(dev: *mut doca_dev, dma: *mut *mut doca_dma) -> doca_error_t;
        fn doca_dma_destroy(dma: *mut doca_dma) -> doca_error_t;
        fn doca_dma_as_ctx(dma: *mut doca_dma) -> *mut doca_ctx;
        /// `DOCA_SUCCESS` if the device can run memcpy tasks.
        fn doca_dma_cap_task_memcpy_is_supported(devinfo: *const doca_devinfo) -> doca_error_t;
        fn doca_dma_cap_task_memcpy_get_max_buf_size(devinfo: *const doca_devinfo, buf_size: *mut u64) -> doca_error_t;
        /// Before `doca_ctx_start`: completion/error callbacks and the task pool size.
        fn doca_dma_task_memcpy_set_conf(
            dma: *mut doca_dma,
            task_completion_cb: doca_dma_task_memcpy_completion_cb_t,
            task_error_cb: doca_dma_task_memcpy_completion_cb_t,
            num_memcpy_tasks: u32,
        ) -> doca_error_t;
        /// Copies `src`'s data into `dst`'s free space (dst data grows).
        fn doca_dma_task_memcpy_alloc_init(
            dma: *mut doca_dma,
            src: *const doca_buf,
            dst: *mut doca_buf,
            user_data: doca_data,
            task: *mut *mut doca_dma_task_memcpy,
        ) -> doca_error_t;
        fn doca_dma_task_memcpy_as_task(task: *mut doca_dma_task_memcpy) -> *mut doca_task;
        fn doca_dma_task_memcpy_get_src(task: *const doca_dma_task_memcpy) -> *const doca_buf;
        fn doca_dma_task_memcpy_get_dst(task: *const doca_dma_task_memcpy) -> *mut doca_buf;
    }
}
