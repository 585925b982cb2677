//! Loads stand-in DOCA libraries built here with the system C compiler: they
//! export the declared symbol names (a few with real bodies) so the loader's
//! success and SymbolMissing paths run without DOCA. Nothing here says the
//! signatures match real DOCA; that is `--features bindgen-check`'s job.

use std::path::Path;
use std::process::Command;

use doca_sys::{AesGcm, Comch, Common, Dma, Doca, DocaError};

/// C bodies for the few functions the tests call; every other symbol gets a
/// stub that is never called.
const REAL: &[(&str, &str)] = &[
    (
        "doca_error_get_name",
        "const char *doca_error_get_name(unsigned e) { return e == 16 ? \"DOCA_ERROR_NOT_FOUND\" : \"DOCA_ERROR_FAKE\"; }",
    ),
    (
        "doca_mmap_create",
        "static char fake_mmap; int doca_mmap_create(void **m) { *m = &fake_mmap; return 0; }",
    ),
    (
        "doca_buf_inventory_buf_get_by_args",
        "unsigned long last_args[4];\n\
         int doca_buf_inventory_buf_get_by_args(void *inv, void *mmap, void *addr, unsigned long len,\n\
             void *data, unsigned long data_len, void **buf) {\n\
           (void)inv; (void)mmap; last_args[0] = (unsigned long)addr; last_args[1] = len;\n\
           last_args[2] = (unsigned long)data; last_args[3] = data_len; *buf = addr; return 7; }",
    ),
];

/// Builds `dir/<file>` exporting `symbols` except `omit`.
fn build_fake(dir: &Path, file: &str, symbols: &[&str], omit: Option<&str>) {
    let mut src = String::new();
    for sym in symbols.iter().filter(|s| Some(**s) != omit) {
        match REAL.iter().find(|(name, _)| name == sym) {
            Some((_, body)) => src.push_str(body),
            None => src.push_str(&format!("int {sym}(void) {{ return 4; }}")),
        }
        src.push('\n');
    }
    let src_dir = dir.join("src");
    std::fs::create_dir_all(&src_dir).expect("mkdir");
    let c = src_dir.join(format!("{file}.c"));
    std::fs::write(&c, src).expect("write C source");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-shared", "-fPIC", "-o"])
        .arg(dir.join(file))
        .arg(&c)
        .status()
        .unwrap_or_else(|e| panic!("these tests need a C compiler ({cc}): {e}"));
    assert!(status.success(), "{cc} failed on {}", c.display());
}

#[test]
fn a_library_without_one_declared_symbol_is_symbol_missing_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let last = *Common::SYMBOLS.last().expect("symbols");
    build_fake(dir.path(), "libdoca_common.so", Common::SYMBOLS, Some(last));
    let err = Common::load_from(dir.path()).expect_err("one symbol short");
    assert!(matches!(err, DocaError::SymbolMissing { lib: "doca_common", symbol } if symbol == last), "{err:?}");
    assert!(err.to_string().contains(last), "{err}");
}

#[test]
fn a_complete_versioned_library_loads_and_its_functions_are_called() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Runtime packages ship only the versioned file.
    build_fake(dir.path(), "libdoca_common.so.3", Common::SYMBOLS, None);
    let common = Common::load_from(dir.path()).expect("loads");
    assert_eq!(common.path(), dir.path().join("libdoca_common.so.3"));
    assert_eq!(common.error_name(16), "DOCA_ERROR_NOT_FOUND");

    let mut mmap = std::ptr::null_mut();
    // SAFETY: the stand-in writes one pointer through its argument.
    let rc = unsafe { common.doca_mmap_create(&mut mmap) };
    assert_eq!(rc, 0);
    assert!(!mmap.is_null());

    // The inline helper forwards (addr, len, addr, 0) like the C header does.
    let mut region = [0u8; 64];
    let addr = region.as_mut_ptr().cast();
    let mut buf = std::ptr::null_mut();
    // SAFETY: the stand-in only records its arguments and writes `buf`.
    let rc = unsafe { common.doca_buf_inventory_buf_get_by_addr(std::ptr::null_mut(), mmap, addr, 64, &mut buf) };
    assert_eq!(doca_sys::DocaErrorCode::from_raw(rc), Some(doca_sys::DocaErrorCode::NoMemory));
    assert_eq!(buf.cast(), addr);
}

#[test]
fn doca_names_the_first_library_that_is_missing() {
    let dir = tempfile::tempdir().expect("tempdir");
    build_fake(dir.path(), "libdoca_common.so", Common::SYMBOLS, None);
    match Doca::load_from(dir.path()) {
        Err(DocaError::LibraryMissing { name: "doca_dma", searched }) => {
            assert_eq!(searched[0], dir.path().join("libdoca_dma.so"));
        }
        other => panic!("expected doca_dma missing, got {other:?}"),
    }
}

#[test]
fn all_four_libraries_load_from_one_folder() {
    let dir = tempfile::tempdir().expect("tempdir");
    build_fake(dir.path(), "libdoca_common.so", Common::SYMBOLS, None);
    build_fake(dir.path(), "libdoca_dma.so", Dma::SYMBOLS, None);
    build_fake(dir.path(), "libdoca_comch.so", Comch::SYMBOLS, None);
    build_fake(dir.path(), "libdoca_aes_gcm.so.2", AesGcm::SYMBOLS, None);
    let doca = Doca::load_from(dir.path()).expect("loads");
    assert_eq!(doca.dir(), dir.path());
    assert_eq!(doca.aes_gcm.path(), dir.path().join("libdoca_aes_gcm.so.2"));
    assert_eq!(Doca::LIBRARIES, ["doca_common", "doca_dma", "doca_comch", "doca_aes_gcm"]);
}
