//! Hand-written declarations of the NVIDIA DOCA calls Sluice uses, resolved
//! at run time.
//!
//! The DOCA headers are proprietary (NVIDIA EULA), so nothing generated from
//! them is committed: the types and signatures here are transcribed from the
//! public DOCA API reference. The libraries are opened with `dlopen` when a
//! backend asks for them ([`Doca::load`]), every declared symbol is resolved
//! up front, and anything missing is a typed error naming the library or
//! symbol. The workspace therefore builds and tests where DOCA is absent.
//!
//! * [`Common`] — `libdoca_common`: devices, representors, mmaps (PCI export,
//!   import, RDMA export), buffer inventories, the progress engine, contexts,
//!   tasks, error names, the RDMA bridge to a verbs PD.
//! * [`Dma`] — `libdoca_dma`: memcpy tasks.
//! * [`Comch`] — `libdoca_comch`: Comch client (host) and server (DPU) messages.
//! * [`AesGcm`] — `libdoca_aes_gcm`: encrypt/decrypt tasks.
//!
//! Libraries come from `$DOCA_LIB_DIR`, else `/opt/mellanox/doca/lib/<arch>-linux-gnu`.
//! `--features bindgen-check` cross-checks every signature against the real
//! headers on a machine with DOCA (docs/doca.md). Only raw declarations live
//! here: ownership, `Drop` and thread-safety belong to the safe wrapper.

#![allow(non_camel_case_types, non_upper_case_globals)]

mod aes_gcm;
mod comch;
mod common;
mod dma;
mod error;
pub(crate) mod loader;
pub mod types;

#[cfg(doca_bindgen)]
pub(crate) mod bindgen_check;

use std::path::{Path, PathBuf};

pub use aes_gcm::AesGcm;
pub use comch::Comch;
pub use common::Common;
pub use dma::Dma;
pub use error::{check, DocaError, DocaErrorCode};
pub use loader::{default_lib_dir, lib_dir, LIB_DIR_ENV};
pub use types::*;

/// Every DOCA library Sluice uses, loaded from one folder.
#[derive(Debug)]
pub struct Doca {
    /// DOCA Core.
    pub common: Common,
    /// DMA memcpy tasks.
    pub dma: Dma,
    /// Comch channels.
    pub comch: Comch,
    /// AES-GCM tasks.
    pub aes_gcm: AesGcm,
    dir: PathBuf,
}

impl Doca {
    /// The libraries in loading order (`doca_common` first: the others
    /// depend on it).
    pub const LIBRARIES: [&'static str; 4] = [Common::LIBRARY, Dma::LIBRARY, Comch::LIBRARY, AesGcm::LIBRARY];

    /// Loads from [`lib_dir`]: `$DOCA_LIB_DIR`, else the DOCA default folder.
    pub fn load() -> Result<Self, DocaError> {
        Self::load_from(&lib_dir())
    }

    /// Loads all four libraries from `dir`, resolving every declared symbol.
    pub fn load_from(dir: &Path) -> Result<Self, DocaError> {
        let common = Common::load_from(dir)?;
        Ok(Self {
            common,
            dma: Dma::load_from(dir)?,
            comch: Comch::load_from(dir)?,
            aes_gcm: AesGcm::load_from(dir)?,
            dir: dir.to_owned(),
        })
    }

    /// The folder the libraries were loaded from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loading_from_an_empty_dir_names_doca_common_first() {
        let dir = tempfile::tempdir().expect("tempdir");
        match Doca::load_from(dir.path()) {
            Err(DocaError::LibraryMissing { name, searched }) => {
                assert_eq!(name, "doca_common");
                assert!(searched.iter().all(|p| p.starts_with(dir.path())), "{searched:?}");
            }
            other => panic!("expected LibraryMissing, got {other:?}"),
        }
    }

    #[test]
    fn symbol_tables_are_complete_and_unique() {
        let mut all: Vec<&str> = [Common::SYMBOLS, Dma::SYMBOLS, Comch::SYMBOLS, AesGcm::SYMBOLS].concat();
        assert!(all.iter().all(|s| s.starts_with("doca_")), "{all:?}");
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n, "a symbol is declared twice");
        for needed in [
            "doca_dev_open",
            "doca_mmap_create",
            "doca_mmap_set_permissions",
            "doca_mmap_export_pci",
            "doca_mmap_create_from_export",
            "doca_mmap_export_rdma",
            "doca_buf_inventory_buf_get_by_args",
            "doca_pe_progress",
            "doca_dma_task_memcpy_alloc_init",
            "doca_comch_server_create",
            "doca_comch_client_task_send_alloc_init",
            "doca_aes_gcm_task_decrypt_alloc_init",
            "doca_rdma_bridge_get_dev_pd",
        ] {
            assert!(all.binary_search(&needed).is_ok(), "{needed} not declared");
        }
    }

    #[test]
    fn doca_data_is_one_register_wide() {
        assert_eq!(std::mem::size_of::<doca_data>(), 8);
        assert_eq!(std::mem::align_of::<doca_data>(), 8);
        assert_eq!(std::mem::size_of::<doca_dev>(), 0);
    }
}
