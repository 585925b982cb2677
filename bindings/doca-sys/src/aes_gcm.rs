//! `libdoca_aes_gcm`: AES-GCM encrypt/decrypt tasks, memory to memory (the
//! staged path: RDMA into DPU memory, decrypt, DMA to the host).
//!
//! Signatures transcribed from the DOCA 3.0 API reference (doca_aes_gcm.h),
//! where the whole API is still marked DOCA_EXPERIMENTAL; unverified against
//! headers until `--features bindgen-check` runs on a DOCA machine
//! (docs/doca.md).

use core::ffi::c_void;

use crate::loader::doca_library;
use crate::types::*;

doca_library! {
    /// The functions of `libdoca_aes_gcm.so`.
    pub struct AesGcm in "doca_aes_gcm" {
        fn doca_aes_gcm_create(dev: *mut doca_dev, aes_gcm: *mut *mut doca_aes_gcm) -> doca_error_t;
        fn doca_aes_gcm_destroy(aes_gcm: *mut doca_aes_gcm) -> doca_error_t;
        fn doca_aes_gcm_as_ctx(aes_gcm: *mut doca_aes_gcm) -> *mut doca_ctx;
        fn doca_aes_gcm_cap_task_encrypt_is_supported(devinfo: *const doca_devinfo) -> doca_error_t;
        fn doca_aes_gcm_cap_task_decrypt_is_supported(devinfo: *const doca_devinfo) -> doca_error_t;
        /// `raw_key`: 16 or 32 bytes per `raw_key_type` (`DOCA_AES_GCM_KEY_*`).
        fn doca_aes_gcm_key_create(
            aes_gcm: *mut doca_aes_gcm,
            raw_key: *const c_void,
            raw_key_type: doca_aes_gcm_key_type,
            key: *mut *mut doca_aes_gcm_key,
        ) -> doca_error_t;
        fn doca_aes_gcm_key_destroy(key: *mut doca_aes_gcm_key) -> doca_error_t;
        fn doca_aes_gcm_task_encrypt_set_conf(
            aes_gcm: *mut doca_aes_gcm,
            task_completion_cb: doca_aes_gcm_task_encrypt_completion_cb_t,
            task_error_cb: doca_aes_gcm_task_encrypt_completion_cb_t,
            num_tasks: u32,
        ) -> doca_error_t;
        /// `tag_size` in bytes (12 or 16); the first `aad_size` bytes of the
        /// source are authenticated, not encrypted.
        fn doca_aes_gcm_task_encrypt_alloc_init(
            aes_gcm: *mut doca_aes_gcm,
            src_buff: *const doca_buf,
            dst_buff: *mut doca_buf,
            key: *mut doca_aes_gcm_key,
            iv: *const u8,
            iv_length: u32,
            tag_size: u32,
            aad_size: u32,
            user_data: doca_data,
            task: *mut *mut doca_aes_gcm_task_encrypt,
        ) -> doca_error_t;
        fn doca_aes_gcm_task_encrypt_as_task(task: *mut doca_aes_gcm_task_encrypt) -> *mut doca_task;
        fn doca_aes_gcm_task_decrypt_set_conf(
            aes_gcm: *mut doca_aes_gcm,
            task_completion_cb: doca_aes_gcm_task_decrypt_completion_cb_t,
            task_error_cb: doca_aes_gcm_task_decrypt_completion_cb_t,
            num_tasks: u32,
        ) -> doca_error_t;
        fn doca_aes_gcm_task_decrypt_alloc_init(
            aes_gcm: *mut doca_aes_gcm,
            src_buff: *const doca_buf,
            dst_buff: *mut doca_buf,
            key: *mut doca_aes_gcm_key,
            iv: *const u8,
            iv_length: u32,
            tag_size: u32,
            aad_size: u32,
            user_data: doca_data,
            task: *mut *mut doca_aes_gcm_task_decrypt,
        ) -> doca_error_t;
        fn doca_aes_gcm_task_decrypt_as_task(task: *mut doca_aes_gcm_task_decrypt) -> *mut doca_task;
    }
}
