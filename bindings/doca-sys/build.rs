//! Nothing to do by default: doca-sys declares DOCA's functions by hand and
//! loads the libraries at run time.
//!
//! With `--features bindgen-check` and DOCA headers present
//! (`$DOCA_INCLUDE_DIR`, else /opt/mellanox/doca/include), bindgen generates
//! DOCA's own declarations of the same functions into OUT_DIR and sets
//! `cfg(doca_bindgen)`, which makes every hand-written signature a compile
//! error if it differs. The output stays in OUT_DIR: never commit it (the
//! headers are proprietary).

fn main() {
    println!("cargo::rustc-check-cfg=cfg(doca_bindgen)");
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "bindgen-check")]
    bindgen_check::run();
}

#[cfg(feature = "bindgen-check")]
mod bindgen_check {
    use std::path::{Path, PathBuf};

    /// Hand-declared C names whose Rust definitions come from src/types.rs.
    const OWN_TYPES: &[&str] = &[
        "doca_devinfo",
        "doca_devinfo_rep",
        "doca_dev",
        "doca_dev_rep",
        "doca_mmap",
        "doca_buf",
        "doca_buf_inventory",
        "doca_pe",
        "doca_ctx",
        "doca_task",
        "doca_dma",
        "doca_dma_task_memcpy",
        "doca_comch_server",
        "doca_comch_client",
        "doca_comch_connection",
        "doca_comch_task_send",
        "doca_comch_event_msg_recv",
        "doca_comch_event_connection_status_changed",
        "doca_aes_gcm",
        "doca_aes_gcm_key",
        "doca_aes_gcm_task_encrypt",
        "doca_aes_gcm_task_decrypt",
        "ibv_pd",
        "doca_data",
    ];

    pub fn run() {
        println!("cargo:rerun-if-env-changed=DOCA_INCLUDE_DIR");
        println!("cargo:rerun-if-changed=wrapper.h");
        let explicit = std::env::var_os("DOCA_INCLUDE_DIR").filter(|d| !d.is_empty());
        let include = explicit.clone().map(PathBuf::from).unwrap_or_else(|| "/opt/mellanox/doca/include".into());
        if !include.join("doca_mmap.h").is_file() {
            if explicit.is_some() {
                panic!("bindgen-check: DOCA_INCLUDE_DIR={} has no doca_mmap.h", include.display());
            }
            println!(
                "cargo:warning=bindgen-check: no DOCA headers in {} (set DOCA_INCLUDE_DIR); nothing was cross-checked",
                include.display()
            );
            return;
        }
        let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("doca_bindings.rs");
        let mut b = bindgen::Builder::default()
            .header("wrapper.h")
            .clang_arg(format!("-I{}", include.display()))
            .clang_arg("-DDOCA_ALLOW_EXPERIMENTAL_API")
            .allowlist_function("doca_.*")
            .allowlist_recursively(true)
            .size_t_is_usize(true)
            .layout_tests(false)
            .generate_comments(false)
            .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
        for t in OWN_TYPES {
            b = b.blocklist_type(t);
        }
        let bindings = b
            .generate()
            .unwrap_or_else(|e| panic!("bindgen over the DOCA headers in {} failed: {e}", include.display()));
        bindings.write_to_file(&out).expect("write bindings");
        println!("cargo:rustc-cfg=doca_bindgen");
        println!("cargo:warning=bindgen-check: checking doca-sys against the DOCA headers in {}", display(&include));
    }

    fn display(p: &Path) -> String {
        p.display().to_string()
    }
}
