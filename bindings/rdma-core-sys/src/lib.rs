//! Raw FFI bindings to rdma-core: libibverbs, librdmacm and mlx5dv, generated
//! by bindgen from the system headers at build time. Nothing else lives here;
//! the safe wrapper is the `sluice-rdma` crate.
//!
//! Static inline functions of the headers (`ibv_post_send`, `ibv_poll_cq`,
//! `ibv_req_notify_cq`, ...) keep their names here; bindgen's
//! `wrap_static_fns` compiles C wrappers for them (symbols `<name>__extern`).

// The generated code follows bindgen's conventions, not the workspace lints.
#![allow(non_camel_case_types, non_snake_case, non_upper_case_globals, dead_code, unsafe_op_in_unsafe_fn)]
#![allow(clippy::all, clippy::undocumented_unsafe_blocks)]

include!(concat!(env!("OUT_DIR"), "/bindings.rs"));

#[cfg(test)]
mod tests {
    use super::*;

    /// Links and calls into libibverbs. With no RDMA in the kernel the list
    /// is NULL (errno ENOSYS); with a device it has one or more entries.
    #[test]
    fn links_and_lists_devices() {
        let mut n = 0i32;
        // SAFETY: ibv_get_device_list accepts a pointer to an int it writes;
        // the returned list (if any) is freed with ibv_free_device_list.
        let list = unsafe { ibv_get_device_list(&mut n) };
        if !list.is_null() {
            assert!(n >= 0);
            // SAFETY: `list` came from ibv_get_device_list and is freed once.
            unsafe { ibv_free_device_list(list) };
        }
    }

    #[test]
    fn static_inline_wrappers_exist() {
        // Taking the address proves the C wrappers were compiled and linked.
        let f: unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> i32 = ibv_post_send;
        assert!(f as usize != 0);
        let g: unsafe extern "C" fn(*mut ibv_cq, i32, *mut ibv_wc) -> i32 = ibv_poll_cq;
        assert!(g as usize != 0);
    }
}
