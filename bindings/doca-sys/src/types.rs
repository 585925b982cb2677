//! C types of the DOCA API: opaque handles, `union doca_data`, the enum
//! values Sluice passes, and the callback types.
//!
//! Transcribed from the DOCA 3.0 API reference (doca_types.h, doca_error.h,
//! doca_dev.h, doca_ctx.h, doca_pe.h, doca_dma.h, doca_comch.h,
//! doca_aes_gcm.h). C enums whose values are all non-negative have type
//! `unsigned int` with GCC and Clang on Linux, hence `c_uint`.

use core::ffi::{c_int, c_uint, c_void};
use core::marker::{PhantomData, PhantomPinned};

macro_rules! opaque {
    ($($(#[$meta:meta])* $name:ident),* $(,)?) => {
        $(
            $(#[$meta])*
            ///
            /// Opaque: only ever handled through pointers that DOCA hands out.
            #[repr(C)]
            pub struct $name {
                _data: [u8; 0],
                // Not Send, Sync or Unpin: DOCA owns the object and its
                // thread-safety rules (see the safe wrapper).
                _marker: PhantomData<(*mut u8, PhantomPinned)>,
            }
        )*
    };
}

opaque!(
    /// `struct doca_devinfo`: a device found by `doca_devinfo_create_list`.
    doca_devinfo,
    /// `struct doca_devinfo_rep`: a representor (DPU side) of a host PCIe function.
    doca_devinfo_rep,
    /// `struct doca_dev`: an opened device.
    doca_dev,
    /// `struct doca_dev_rep`: an opened representor.
    doca_dev_rep,
    /// `struct doca_mmap`: registered memory ranges.
    doca_mmap,
    /// `struct doca_buf`: a slice of an mmap, taken from an inventory.
    doca_buf,
    /// `struct doca_buf_inventory`: a pool of `doca_buf` descriptors.
    doca_buf_inventory,
    /// `struct doca_pe`: a progress engine (completion polling / notification).
    doca_pe,
    /// `struct doca_ctx`: the context every DOCA library object exposes.
    doca_ctx,
    /// `struct doca_task`: the generic view of any task.
    doca_task,
    /// `struct doca_dma`: a DMA context.
    doca_dma,
    /// `struct doca_dma_task_memcpy`: a DMA copy task.
    doca_dma_task_memcpy,
    /// `struct doca_comch_server`: the DPU side of a Comch channel.
    doca_comch_server,
    /// `struct doca_comch_client`: the host side of a Comch channel.
    doca_comch_client,
    /// `struct doca_comch_connection`: one client connected to a server.
    doca_comch_connection,
    /// `struct doca_comch_task_send`: a message send task.
    doca_comch_task_send,
    /// `struct doca_comch_event_msg_recv`: the message-received event.
    doca_comch_event_msg_recv,
    /// `struct doca_comch_event_connection_status_changed`: connect/disconnect event.
    doca_comch_event_connection_status_changed,
    /// `struct doca_aes_gcm`: an AES-GCM context.
    doca_aes_gcm,
    /// `struct doca_aes_gcm_key`: a key loaded into an AES-GCM context.
    doca_aes_gcm_key,
    /// `struct doca_aes_gcm_task_encrypt`: an encrypt task.
    doca_aes_gcm_task_encrypt,
    /// `struct doca_aes_gcm_task_decrypt`: a decrypt task.
    doca_aes_gcm_task_decrypt,
    /// `struct ibv_pd` (rdma-core): the verbs protection domain behind a
    /// `doca_dev`. Cast to `rdma_core_sys::ibv_pd` to use it with verbs.
    ibv_pd,
);

/// `doca_error_t` (`enum doca_error`): `DOCA_SUCCESS` or an error code; see
/// [`crate::DocaErrorCode`].
pub type doca_error_t = c_uint;
/// `DOCA_SUCCESS`.
pub const DOCA_SUCCESS: doca_error_t = 0;

/// `union doca_data`: user data attached to tasks, contexts and connections.
/// Passed by value (8 bytes, an integer register on x86_64 and aarch64).
#[repr(C)]
#[derive(Clone, Copy)]
pub union doca_data {
    /// `void *ptr`
    pub ptr: *mut c_void,
    /// `uint64_t u64`
    pub u64: u64,
}

impl doca_data {
    /// No user data.
    pub const NONE: doca_data = doca_data { u64: 0 };
}

impl core::fmt::Debug for doca_data {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        // SAFETY: both fields are 8-byte plain data with no invalid bit
        // patterns, so reading either one is always defined.
        let v = unsafe { self.u64 };
        write!(f, "doca_data({v:#x})")
    }
}

/// `doca_notification_handle_t` on Linux: a file descriptor to poll
/// (`doca_event_handle_t` is `int` under `__linux__`).
pub type doca_notification_handle_t = c_int;

/// `enum doca_access_flag`: mmap permissions (`doca_mmap_set_permissions`).
pub type doca_access_flag = c_uint;
pub const DOCA_ACCESS_FLAG_LOCAL_READ_ONLY: doca_access_flag = 0;
pub const DOCA_ACCESS_FLAG_LOCAL_READ_WRITE: doca_access_flag = 1 << 0;
pub const DOCA_ACCESS_FLAG_RDMA_READ: doca_access_flag = 1 << 1;
pub const DOCA_ACCESS_FLAG_RDMA_WRITE: doca_access_flag = 1 << 2;
pub const DOCA_ACCESS_FLAG_RDMA_ATOMIC: doca_access_flag = 1 << 3;
pub const DOCA_ACCESS_FLAG_PCI_READ_ONLY: doca_access_flag = 1 << 4;
pub const DOCA_ACCESS_FLAG_PCI_READ_WRITE: doca_access_flag = 1 << 5;
pub const DOCA_ACCESS_FLAG_PCI_RELAXED_ORDERING: doca_access_flag = 1 << 6;

/// `enum doca_devinfo_rep_filter` (passed as `int`).
pub const DOCA_DEVINFO_REP_FILTER_ALL: c_int = 0;
pub const DOCA_DEVINFO_REP_FILTER_NET: c_int = 1 << 1;
pub const DOCA_DEVINFO_REP_FILTER_EMULATED: c_int = 1 << 2;

/// `DOCA_DEVINFO_PCI_ADDR_SIZE`: buffer size for a PCI address string
/// ("XXXX:XX:XX.X" and the NUL).
pub const DOCA_DEVINFO_PCI_ADDR_SIZE: usize = 13;
/// `DOCA_DEVINFO_REP_PCI_ADDR_SIZE`.
pub const DOCA_DEVINFO_REP_PCI_ADDR_SIZE: usize = 13;
/// `DOCA_DEVINFO_IBDEV_NAME_SIZE`.
pub const DOCA_DEVINFO_IBDEV_NAME_SIZE: usize = 64;

/// `enum doca_pci_func_type`.
pub type doca_pci_func_type = c_uint;
pub const DOCA_PCI_FUNC_TYPE_PF: doca_pci_func_type = 0;
pub const DOCA_PCI_FUNC_TYPE_VF: doca_pci_func_type = 1;
pub const DOCA_PCI_FUNC_TYPE_SF: doca_pci_func_type = 2;

/// `enum doca_ctx_states`.
pub type doca_ctx_states = c_uint;
pub const DOCA_CTX_STATE_IDLE: doca_ctx_states = 0;
pub const DOCA_CTX_STATE_STARTING: doca_ctx_states = 1;
pub const DOCA_CTX_STATE_RUNNING: doca_ctx_states = 2;
pub const DOCA_CTX_STATE_STOPPING: doca_ctx_states = 3;

/// `enum doca_aes_gcm_key_type`.
pub type doca_aes_gcm_key_type = c_uint;
pub const DOCA_AES_GCM_KEY_128: doca_aes_gcm_key_type = 1;
pub const DOCA_AES_GCM_KEY_256: doca_aes_gcm_key_type = 2;

/// `doca_ctx_state_changed_callback_t`.
pub type doca_ctx_state_changed_callback_t = Option<
    unsafe extern "C" fn(user_data: doca_data, ctx: *mut doca_ctx, prev: doca_ctx_states, next: doca_ctx_states),
>;

/// `doca_dma_task_memcpy_completion_cb_t` (success and error callbacks).
pub type doca_dma_task_memcpy_completion_cb_t =
    Option<unsafe extern "C" fn(task: *mut doca_dma_task_memcpy, task_user_data: doca_data, ctx_user_data: doca_data)>;

/// `doca_comch_task_send_completion_cb_t`.
pub type doca_comch_task_send_completion_cb_t =
    Option<unsafe extern "C" fn(task: *mut doca_comch_task_send, task_user_data: doca_data, ctx_user_data: doca_data)>;

/// `doca_comch_event_msg_recv_cb_t`: `recv_buffer` is valid only during the call.
pub type doca_comch_event_msg_recv_cb_t = Option<
    unsafe extern "C" fn(
        event: *mut doca_comch_event_msg_recv,
        recv_buffer: *mut u8,
        msg_len: u32,
        comch_connection: *mut doca_comch_connection,
    ),
>;

/// `doca_comch_event_connection_status_changed_cb_t`.
pub type doca_comch_event_connection_status_changed_cb_t = Option<
    unsafe extern "C" fn(
        event: *mut doca_comch_event_connection_status_changed,
        comch_connection: *mut doca_comch_connection,
        change_successful: u8,
    ),
>;

/// `doca_aes_gcm_task_encrypt_completion_cb_t`.
pub type doca_aes_gcm_task_encrypt_completion_cb_t = Option<
    unsafe extern "C" fn(task: *mut doca_aes_gcm_task_encrypt, task_user_data: doca_data, ctx_user_data: doca_data),
>;

/// `doca_aes_gcm_task_decrypt_completion_cb_t`.
pub type doca_aes_gcm_task_decrypt_completion_cb_t = Option<
    unsafe extern "C" fn(task: *mut doca_aes_gcm_task_decrypt, task_user_data: doca_data, ctx_user_data: doca_data),
>;
