//! Generates bindings from Debian's rdma-core headers (libibverbs-dev,
//! librdmacm-dev). The static inline verbs (`ibv_post_send`, `ibv_poll_cq`,
//! ...) are wrapped by bindgen into a small C file compiled here.
//!
//! `RDMA_CORE_INCLUDE_DIR` / `RDMA_CORE_LIB_DIR` override where headers and
//! libraries are found.

use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-env-changed=RDMA_CORE_INCLUDE_DIR");
    println!("cargo:rerun-if-env-changed=RDMA_CORE_LIB_DIR");
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
    let include = env::var("RDMA_CORE_INCLUDE_DIR").ok();
    if let Ok(dir) = env::var("RDMA_CORE_LIB_DIR") {
        println!("cargo:rustc-link-search=native={dir}");
    }
    for lib in ["ibverbs", "rdmacm", "mlx5"] {
        println!("cargo:rustc-link-lib=dylib={lib}");
    }

    let wrap_c = out.join("static_wrappers.c");
    let mut b = bindgen::Builder::default()
        .header("wrapper.h")
        .allowlist_function("ibv_.*|___ibv_query_port|rdma_.*|mlx5dv_.*")
        .allowlist_type("ibv_.*|rdma_.*|mlx5dv_.*|mlx5_wqe_.*")
        .allowlist_var("IBV_.*|RDMA_.*|MLX5DV_.*")
        .wrap_static_fns(true)
        .wrap_static_fns_path(out.join("static_wrappers"))
        .derive_default(true)
        .derive_debug(true)
        .prepend_enum_name(false)
        .layout_tests(false)
        .generate_comments(false)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
    if let Some(dir) = &include {
        b = b.clang_arg(format!("-I{dir}"));
    }
    let bindings = b.generate().unwrap_or_else(|e| {
        panic!("bindgen over rdma-core headers failed ({e}); install libibverbs-dev, librdmacm-dev and libclang-dev")
    });
    bindings.write_to_file(out.join("bindings.rs")).expect("write bindings");

    let mut cc = cc::Build::new();
    cc.file(&wrap_c)
        .include(env::var("CARGO_MANIFEST_DIR").expect("manifest dir"))
        .flag_if_supported("-Wno-unused-parameter");
    if let Some(dir) = &include {
        cc.include(dir);
    }
    // The generated file includes the header by its path.
    cc.flag("-include").flag("wrapper.h");
    cc.compile("rdma_core_static_wrappers");
}
