//! Errors: loading the DOCA libraries, and `doca_error_t` as a typed code.

use std::fmt;
use std::path::PathBuf;

use crate::types::{doca_error_t, DOCA_SUCCESS};

/// Why DOCA could not be loaded or a DOCA call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DocaError {
    /// No file for the library in the searched locations.
    #[error(
        "DOCA library {name} not found (searched: {}); install the DOCA runtime \
         (doca-runtime / doca-sdk-*) or point DOCA_LIB_DIR at the folder holding lib{name}.so*",
        paths(searched)
    )]
    LibraryMissing {
        /// Library name without `lib` and `.so`, e.g. `doca_common`.
        name: &'static str,
        /// The candidate paths tried, in order (a `*` stands for any version suffix).
        searched: Vec<PathBuf>,
    },
    /// The file exists but the dynamic loader refused it (wrong architecture,
    /// a missing dependency such as libibverbs, ...).
    #[error("cannot load DOCA library {}: {reason}", path.display())]
    LibraryLoad {
        /// The file passed to `dlopen`.
        path: PathBuf,
        /// `dlerror()`'s message.
        reason: String,
    },
    /// The library lacks a function these declarations expect: a DOCA
    /// version without it (or one that renamed it).
    #[error("DOCA library {lib} has no symbol {symbol} (DOCA version mismatch? doca-sys follows DOCA 3.x)")]
    SymbolMissing {
        /// Library name, e.g. `doca_dma`.
        lib: &'static str,
        /// The first missing symbol, in declaration order.
        symbol: &'static str,
    },
    /// A DOCA call returned an error code.
    #[error("{call} failed: {code}")]
    Call {
        /// The C function, e.g. `doca_mmap_start`.
        call: &'static str,
        /// What it returned.
        code: DocaErrorCode,
    },
}

fn paths(p: &[PathBuf]) -> String {
    p.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
}

macro_rules! codes {
    ($($raw:literal => $variant:ident $name:literal,)*) => {
        /// A `doca_error_t` other than `DOCA_SUCCESS` (values of DOCA 3.0's
        /// `enum doca_error`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum DocaErrorCode {
            $(
                #[doc = concat!("`", $name, "` (", stringify!($raw), ")")]
                $variant,
            )*
            /// A code this crate does not know (a newer DOCA).
            Unrecognized(doca_error_t),
        }

        impl DocaErrorCode {
            /// The code for `raw`; `None` for `DOCA_SUCCESS`.
            pub fn from_raw(raw: doca_error_t) -> Option<Self> {
                match raw {
                    DOCA_SUCCESS => None,
                    $($raw => Some(Self::$variant),)*
                    other => Some(Self::Unrecognized(other)),
                }
            }

            /// The C value.
            pub fn raw(self) -> doca_error_t {
                match self {
                    $(Self::$variant => $raw,)*
                    Self::Unrecognized(raw) => raw,
                }
            }

            /// DOCA's name for the code, e.g. `DOCA_ERROR_NOT_FOUND`
            /// (what `doca_error_get_name` returns).
            pub fn name(self) -> &'static str {
                match self {
                    $(Self::$variant => $name,)*
                    Self::Unrecognized(_) => "DOCA_ERROR_UNRECOGNIZED",
                }
            }
        }
    };
}

codes! {
    1 => Unknown "DOCA_ERROR_UNKNOWN",
    2 => NotPermitted "DOCA_ERROR_NOT_PERMITTED",
    3 => InUse "DOCA_ERROR_IN_USE",
    4 => NotSupported "DOCA_ERROR_NOT_SUPPORTED",
    5 => Again "DOCA_ERROR_AGAIN",
    6 => InvalidValue "DOCA_ERROR_INVALID_VALUE",
    7 => NoMemory "DOCA_ERROR_NO_MEMORY",
    8 => Initialization "DOCA_ERROR_INITIALIZATION",
    9 => TimeOut "DOCA_ERROR_TIME_OUT",
    10 => Shutdown "DOCA_ERROR_SHUTDOWN",
    11 => ConnectionReset "DOCA_ERROR_CONNECTION_RESET",
    12 => ConnectionAborted "DOCA_ERROR_CONNECTION_ABORTED",
    13 => ConnectionInProgress "DOCA_ERROR_CONNECTION_INPROGRESS",
    14 => NotConnected "DOCA_ERROR_NOT_CONNECTED",
    15 => NoLock "DOCA_ERROR_NO_LOCK",
    16 => NotFound "DOCA_ERROR_NOT_FOUND",
    17 => IoFailed "DOCA_ERROR_IO_FAILED",
    18 => BadState "DOCA_ERROR_BAD_STATE",
    19 => UnsupportedVersion "DOCA_ERROR_UNSUPPORTED_VERSION",
    20 => OperatingSystem "DOCA_ERROR_OPERATING_SYSTEM",
    21 => Driver "DOCA_ERROR_DRIVER",
    22 => Unexpected "DOCA_ERROR_UNEXPECTED",
    23 => AlreadyExist "DOCA_ERROR_ALREADY_EXIST",
    24 => Full "DOCA_ERROR_FULL",
    25 => Empty "DOCA_ERROR_EMPTY",
    26 => InProgress "DOCA_ERROR_IN_PROGRESS",
    27 => TooBig "DOCA_ERROR_TOO_BIG",
    28 => Authentication "DOCA_ERROR_AUTHENTICATION",
    29 => BadConfig "DOCA_ERROR_BAD_CONFIG",
    30 => Skipped "DOCA_ERROR_SKIPPED",
}

impl DocaErrorCode {
    /// `DOCA_ERROR_AGAIN`: retry later (queue full, not ready yet).
    pub fn is_again(self) -> bool {
        self == Self::Again
    }
}

impl fmt::Display for DocaErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.raw())
    }
}

/// `Ok(())` for `DOCA_SUCCESS`, otherwise [`DocaError::Call`] naming `call`.
pub fn check(call: &'static str, raw: doca_error_t) -> Result<(), DocaError> {
    match DocaErrorCode::from_raw(raw) {
        None => Ok(()),
        Some(code) => Err(DocaError::Call { call, code }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn success_is_not_an_error() {
        assert_eq!(DocaErrorCode::from_raw(0), None);
        assert!(check("doca_mmap_start", 0).is_ok());
    }

    #[test]
    fn every_known_code_round_trips_with_its_doca_name() {
        for raw in 1..=30 {
            let code = DocaErrorCode::from_raw(raw).expect("an error");
            assert!(!matches!(code, DocaErrorCode::Unrecognized(_)), "{raw} should be known");
            assert_eq!(code.raw(), raw);
            assert!(code.name().starts_with("DOCA_ERROR_"), "{}", code.name());
        }
        assert_eq!(DocaErrorCode::from_raw(16), Some(DocaErrorCode::NotFound));
        assert_eq!(DocaErrorCode::NotFound.name(), "DOCA_ERROR_NOT_FOUND");
        assert_eq!(DocaErrorCode::from_raw(5).map(DocaErrorCode::is_again), Some(true));
        assert_eq!(DocaErrorCode::from_raw(13).map(DocaErrorCode::name), Some("DOCA_ERROR_CONNECTION_INPROGRESS"));
        assert_eq!(DocaErrorCode::from_raw(30).map(DocaErrorCode::name), Some("DOCA_ERROR_SKIPPED"));
    }

    #[test]
    fn unknown_codes_keep_their_value() {
        let code = DocaErrorCode::from_raw(4242).expect("an error");
        assert_eq!(code, DocaErrorCode::Unrecognized(4242));
        assert_eq!(code.raw(), 4242);
        assert_eq!(code.to_string(), "DOCA_ERROR_UNRECOGNIZED (4242)");
    }

    #[test]
    fn failed_call_names_the_call_and_the_doca_error() {
        let err = check("doca_mmap_create_from_export", 6).expect_err("INVALID_VALUE");
        assert!(matches!(
            err,
            DocaError::Call { call: "doca_mmap_create_from_export", code: DocaErrorCode::InvalidValue }
        ));
        assert_eq!(err.to_string(), "doca_mmap_create_from_export failed: DOCA_ERROR_INVALID_VALUE (6)");
    }
}
