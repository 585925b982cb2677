//! `libdoca_comch`: the Comch channel between the host (client) and the DPU
//! (server, bound to the representor of one host PCIe function). Comch is
//! not TCP/IP; messages are small (see `doca_comch_cap_get_max_msg_size`).
//!
//! Signatures transcribed from the DOCA 3.0 API reference (doca_comch.h);
//! unverified against headers until `--features bindgen-check` runs on a DOCA
//! machine (docs/doca.md).

use core::ffi::{c_char, c_void};

use crate::loader::doca_library;
use crate::types::*;

doca_library! {
    /// The functions of `libdoca_comch.so`.
    pub struct Comch in "doca_comch" {
        fn doca_comch_cap_get_max_msg_size(devinfo: *const doca_devinfo, size: *mut u32) -> doca_error_t;
        fn doca_comch_cap_server_is_supported(devinfo: *const doca_devinfo) -> doca_error_t;
        fn doca_comch_cap_client_is_supported(devinfo: *const doca_devinfo) -> doca_error_t;

        // --- server (DPU)
        /// `name`: the service name clients connect to (NUL-terminated).
        fn doca_comch_server_create(
            dev: *mut doca_dev,
            repr: *mut doca_dev_rep,
            name: *const c_char,
            comch_server: *mut *mut doca_comch_server,
        ) -> doca_error_t;
        fn doca_comch_server_destroy(comch_server: *mut doca_comch_server) -> doca_error_t;
        fn doca_comch_server_as_ctx(comch_server: *mut doca_comch_server) -> *mut doca_ctx;
        fn doca_comch_server_set_max_msg_size(comch_server: *mut doca_comch_server, size: u32) -> doca_error_t;
        fn doca_comch_server_set_recv_queue_size(comch_server: *mut doca_comch_server, size: u32) -> doca_error_t;
        fn doca_comch_server_task_send_set_conf(
            comch_server: *mut doca_comch_server,
            task_completion_cb: doca_comch_task_send_completion_cb_t,
            task_error_cb: doca_comch_task_send_completion_cb_t,
            num_send_tasks: u32,
        ) -> doca_error_t;
        /// The message is copied into the task.
        fn doca_comch_server_task_send_alloc_init(
            comch_server: *mut doca_comch_server,
            peer: *mut doca_comch_connection,
            msg: *const c_void,
            len: u32,
            task: *mut *mut doca_comch_task_send,
        ) -> doca_error_t;
        fn doca_comch_server_event_msg_recv_register(
            comch_server: *mut doca_comch_server,
            recv_event_cb: doca_comch_event_msg_recv_cb_t,
        ) -> doca_error_t;
        fn doca_comch_server_event_connection_status_changed_register(
            comch_server: *mut doca_comch_server,
            connect_event_cb: doca_comch_event_connection_status_changed_cb_t,
            disconnect_event_cb: doca_comch_event_connection_status_changed_cb_t,
        ) -> doca_error_t;
        fn doca_comch_server_disconnect(
            comch_server: *mut doca_comch_server,
            connection: *mut doca_comch_connection,
        ) -> doca_error_t;

        // --- client (host)
        fn doca_comch_client_create(
            dev: *mut doca_dev,
            name: *const c_char,
            comch_client: *mut *mut doca_comch_client,
        ) -> doca_error_t;
        fn doca_comch_client_destroy(comch_client: *mut doca_comch_client) -> doca_error_t;
        fn doca_comch_client_as_ctx(comch_client: *mut doca_comch_client) -> *mut doca_ctx;
        fn doca_comch_client_set_max_msg_size(comch_client: *mut doca_comch_client, size: u32) -> doca_error_t;
        fn doca_comch_client_set_recv_queue_size(comch_client: *mut doca_comch_client, size: u32) -> doca_error_t;
        /// The connection to the server, once the context is running.
        fn doca_comch_client_get_connection(
            comch_client: *const doca_comch_client,
            connection: *mut *mut doca_comch_connection,
        ) -> doca_error_t;
        fn doca_comch_client_task_send_set_conf(
            comch_client: *mut doca_comch_client,
            task_completion_cb: doca_comch_task_send_completion_cb_t,
            task_error_cb: doca_comch_task_send_completion_cb_t,
            num_send_tasks: u32,
        ) -> doca_error_t;
        fn doca_comch_client_task_send_alloc_init(
            comch_client: *mut doca_comch_client,
            peer: *mut doca_comch_connection,
            msg: *const c_void,
            len: u32,
            task: *mut *mut doca_comch_task_send,
        ) -> doca_error_t;
        fn doca_comch_client_event_msg_recv_register(
            comch_client: *mut doca_comch_client,
            recv_event_cb: doca_comch_event_msg_recv_cb_t,
        ) -> doca_error_t;

        // --- both ends
        fn doca_comch_task_send_as_task(task: *mut doca_comch_task_send) -> *mut doca_task;
        fn doca_comch_connection_set_user_data(
            connection: *mut doca_comch_connection,
            user_data: doca_data,
        ) -> doca_error_t;
        fn doca_comch_connection_get_user_data(connection: *const doca_comch_connection) -> doca_data;
    }
}
