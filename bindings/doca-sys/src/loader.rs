//! Finding, opening and resolving the DOCA shared libraries at run time.

use std::ffi::CString;
use std::path::{Path, PathBuf};

use libloading::os::unix::{Library as UnixLibrary, RTLD_LOCAL, RTLD_NOW};
use libloading::Library;

use crate::error::DocaError;

/// Environment variable naming the folder that holds `libdoca_*.so*`.
pub const LIB_DIR_ENV: &str = "DOCA_LIB_DIR";

/// Where DOCA installs its libraries: `/opt/mellanox/doca/lib/<arch>-linux-gnu`
/// (`aarch64-linux-gnu` on the BlueField Arm cores, `x86_64-linux-gnu` on hosts).
pub fn default_lib_dir() -> PathBuf {
    PathBuf::from(format!("/opt/mellanox/doca/lib/{}-linux-gnu", std::env::consts::ARCH))
}

/// `$DOCA_LIB_DIR` if set and not empty, else [`default_lib_dir`].
pub fn lib_dir() -> PathBuf {
    match std::env::var_os(LIB_DIR_ENV) {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => default_lib_dir(),
    }
}

/// The paths tried for library `name` in `dir`, in order: the development
/// symlink `lib<name>.so`, then any versioned `lib<name>.so.*` (the runtime
/// packages ship only those), highest version first.
fn candidates(dir: &Path, name: &str) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let plain = format!("lib{name}.so");
    let searched = vec![dir.join(&plain), dir.join(format!("{plain}.*"))];
    let mut found = Vec::new();
    if dir.join(&plain).is_file() {
        found.push(dir.join(&plain));
    }
    let prefix = format!("{plain}.");
    let mut versioned: Vec<(Vec<u64>, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let file = e.file_name().into_string().ok()?;
            // Only numeric suffixes: libdoca_x.so.2, libdoca_x.so.2.9.0.
            let key =
                file.strip_prefix(&prefix)?.split('.').map(|p| p.parse::<u64>().ok()).collect::<Option<Vec<_>>>()?;
            e.path().is_file().then(|| (key, e.path()))
        })
        .collect();
    versioned.sort_by(|a, b| b.0.cmp(&a.0));
    found.extend(versioned.into_iter().map(|(_, p)| p));
    (searched, found)
}

/// Opens `lib<name>.so*` from `dir` with `RTLD_NOW | RTLD_LOCAL`, so a library
/// whose own dependencies are unresolvable fails here rather than at first call.
pub(crate) fn open(dir: &Path, name: &'static str) -> Result<(Library, PathBuf), DocaError> {
    let (searched, found) = candidates(dir, name);
    let Some(path) = found.into_iter().next() else {
        return Err(DocaError::LibraryMissing { name, searched });
    };
    // SAFETY: loading a DOCA library runs its ELF constructors. DOCA's are
    // initialisation routines with no preconditions on the caller; the
    // library is only used through the declarations in this crate.
    let lib = unsafe { UnixLibrary::open(Some(&path), RTLD_NOW | RTLD_LOCAL) }
        .map_err(|e| DocaError::LibraryLoad { path: path.clone(), reason: e.to_string() })?;
    Ok((lib.into(), path))
}

/// Looks up `symbol` in `lib` as a value of type `T` (a function pointer).
///
/// # Safety
/// `T` must be the C type of `symbol` (the declarations in this crate).
pub(crate) unsafe fn resolve<T: Copy>(
    lib: &Library,
    lib_name: &'static str,
    symbol: &'static str,
) -> Result<T, DocaError> {
    let missing = || DocaError::SymbolMissing { lib: lib_name, symbol };
    let cname = CString::new(symbol).map_err(|_| missing())?;
    // SAFETY: the caller guarantees `T` is the symbol's type; the value is
    // copied out and only used while the owning struct keeps `lib` loaded.
    let sym = unsafe { lib.get::<T>(cname.as_bytes_with_nul()) }.map_err(|_| missing())?;
    Ok(*sym)
}

/// Declares one DOCA library: a struct holding every function pointer,
/// resolved when the library is loaded, and an `unsafe` method per function.
macro_rules! doca_library {
    (
        $(#[$meta:meta])*
        pub struct $name:ident in $lib:literal {
            $(
                $(#[$fmeta:meta])*
                fn $fname:ident($($arg:ident: $aty:ty),* $(,)?) $(-> $ret:ty)?;
            )*
        }
    ) => {
        $(#[$meta])*
        pub struct $name {
            $($fname: unsafe extern "C" fn($($aty),*) $(-> $ret)?,)*
            path: ::std::path::PathBuf,
            // Keeps the library mapped while the pointers above exist.
            _lib: ::libloading::Library,
        }

        impl $name {
            /// The library's name without `lib` and `.so`.
            pub const LIBRARY: &'static str = $lib;
            /// Every symbol resolved at load time, in declaration order.
            pub const SYMBOLS: &'static [&'static str] = &[$(stringify!($fname)),*];

            /// Loads the library from `dir` and resolves every declared symbol.
            pub fn load_from(dir: &::std::path::Path) -> Result<Self, $crate::DocaError> {
                let (lib, path) = $crate::loader::open(dir, $lib)?;
                Ok(Self {
                    $(
                        // SAFETY: the field's type is the declaration
                        // transcribed from the DOCA API reference (checked
                        // against the headers by the bindgen-check feature).
                        $fname: unsafe { $crate::loader::resolve(&lib, $lib, stringify!($fname))? },
                    )*
                    path,
                    _lib: lib,
                })
            }

            /// The file that was loaded.
            pub fn path(&self) -> &::std::path::Path {
                &self.path
            }

            $(
                $(#[$fmeta])*
                #[doc = ""]
                #[doc = concat!("Calls `", stringify!($fname), "`.")]
                #[doc = ""]
                #[doc = "# Safety"]
                #[doc = "The C contract of this function in the DOCA API reference: valid, live"]
                #[doc = "pointers of the right kind, objects in the required state, and DOCA's"]
                #[doc = "threading rules for the objects involved."]
                #[allow(clippy::too_many_arguments)]
                #[inline]
                pub unsafe fn $fname(&self, $($arg: $aty),*) $(-> $ret)? {
                    // SAFETY: the caller upholds the function's C contract
                    // (see above); the pointer stays valid while `self`
                    // keeps the library loaded.
                    unsafe { (self.$fname)($($arg),*) }
                }
            )*
        }

        impl ::std::fmt::Debug for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.debug_struct(stringify!($name)).field("path", &self.path).finish_non_exhaustive()
            }
        }

        // With `--features bindgen-check` on a machine with DOCA headers, each
        // declaration must coerce from the bindgen-generated one: any
        // difference in argument or return types is a compile error.
        #[cfg(doca_bindgen)]
        const _: () = {
            $(
                let _: unsafe extern "C" fn($($aty),*) $(-> $ret)? = $crate::bindgen_check::generated::$fname;
            )*
        };
    };
}

pub(crate) use doca_library;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_library_names_itself_and_every_path_searched() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = open(dir.path(), "doca_common").map(|_| ()).expect_err("empty dir");
        match &err {
            DocaError::LibraryMissing { name, searched } => {
                assert_eq!(*name, "doca_common");
                assert_eq!(
                    searched,
                    &vec![dir.path().join("libdoca_common.so"), dir.path().join("libdoca_common.so.*")]
                );
            }
            other => panic!("expected LibraryMissing, got {other:?}"),
        }
        let msg = err.to_string();
        assert!(msg.contains("doca_common") && msg.contains(&dir.path().display().to_string()), "{msg}");
        assert!(msg.contains("DOCA_LIB_DIR"), "{msg}");
    }

    #[test]
    fn nonexistent_dir_is_library_missing_not_a_panic() {
        let dir = Path::new("/nonexistent/doca/lib");
        let err = open(dir, "doca_dma").map(|_| ()).expect_err("no dir");
        assert!(
            matches!(&err, DocaError::LibraryMissing { name: "doca_dma", searched } if searched[0] == dir.join("libdoca_dma.so")),
            "{err:?}"
        );
    }

    #[test]
    fn versioned_runtime_libraries_are_found_highest_first() {
        let dir = tempfile::tempdir().expect("tempdir");
        let files = ["libdoca_comch.so.2.9.0", "libdoca_comch.so.3.0.1", "libdoca_comch.so.10", "libdoca_comchx.so.99"];
        for f in files.iter().chain(&["libdoca_comch.so.3.c", "libdoca_comch.so.bak"]) {
            std::fs::write(dir.path().join(f), b"").expect("write");
        }
        let (_, found) = candidates(dir.path(), "doca_comch");
        let names: Vec<_> = found.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
        assert_eq!(names, ["libdoca_comch.so.10", "libdoca_comch.so.3.0.1", "libdoca_comch.so.2.9.0"]);
        std::fs::write(dir.path().join("libdoca_comch.so"), b"").expect("write");
        let (_, found) = candidates(dir.path(), "doca_comch");
        assert_eq!(found[0], dir.path().join("libdoca_comch.so"));
    }

    #[test]
    fn a_file_that_is_not_a_library_is_a_load_error_with_the_reason() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("libdoca_aes_gcm.so"), b"not an ELF file").expect("write");
        let err = open(dir.path(), "doca_aes_gcm").map(|_| ()).expect_err("garbage");
        match err {
            DocaError::LibraryLoad { path, reason } => {
                assert_eq!(path, dir.path().join("libdoca_aes_gcm.so"));
                assert!(!reason.is_empty());
            }
            other => panic!("expected LibraryLoad, got {other:?}"),
        }
    }

    #[test]
    fn default_dir_follows_the_architecture() {
        let d = default_lib_dir();
        assert!(d.starts_with("/opt/mellanox/doca/lib"));
        assert!(d.to_string_lossy().ends_with(&format!("{}-linux-gnu", std::env::consts::ARCH)));
    }
}
