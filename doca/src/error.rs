//! Errors of the safe DOCA layer.

use doca_sys::{DocaError, DocaErrorCode};

/// Why a DOCA operation could not be done.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The libraries are missing or incomplete, or a call returned an error
    /// code (the library, symbol or call is named).
    #[error(transparent)]
    Doca(#[from] DocaError),
    /// No DOCA device matches the configured selector.
    #[error("no DOCA device matches {wanted:?} (found: {})", if found.is_empty() { "none".to_owned() } else { found.join(", ") })]
    NoDevice { wanted: String, found: Vec<String> },
    /// A task finished with an error status.
    #[error("DOCA {what} task failed: {code}")]
    Task { what: &'static str, code: DocaErrorCode },
    /// A task did not complete in time (a hung device or engine).
    #[error("DOCA {what} task did not complete within {millis} ms")]
    TimedOut { what: &'static str, millis: u64 },
    /// A Sluice export envelope that does not parse or does not fit.
    #[error("bad memory export: {0}")]
    BadExport(String),
    /// An argument outside what the object supports (range, size).
    #[error("{0}")]
    Invalid(String),
}

/// `Ok` for `DOCA_SUCCESS`, else the call and its code.
pub(crate) fn check(call: &'static str, rc: doca_sys::doca_error_t) -> Result<(), Error> {
    doca_sys::check(call, rc).map_err(Error::from)
}

impl Error {
    /// The DOCA error code behind this error, if there is one.
    pub fn code(&self) -> Option<DocaErrorCode> {
        match self {
            Error::Doca(DocaError::Call { code, .. }) | Error::Task { code, .. } => Some(*code),
            _ => None,
        }
    }
}
