//! `DOCA_LIB_DIR` overrides the default folder (alone in this binary because
//! it changes the process environment).

use doca_sys::{default_lib_dir, lib_dir, Doca, DocaError, LIB_DIR_ENV};

#[test]
fn doca_lib_dir_is_where_doca_load_looks() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::env::set_var(LIB_DIR_ENV, dir.path());
    assert_eq!(lib_dir(), dir.path());
    match Doca::load() {
        Err(DocaError::LibraryMissing { name: "doca_common", searched }) => {
            assert!(searched.iter().all(|p| p.starts_with(dir.path())), "{searched:?}");
        }
        other => panic!("expected LibraryMissing in $DOCA_LIB_DIR, got {other:?}"),
    }
    std::env::set_var(LIB_DIR_ENV, "");
    assert_eq!(lib_dir(), default_lib_dir());
    std::env::remove_var(LIB_DIR_ENV);
    assert_eq!(lib_dir(), default_lib_dir());
}
