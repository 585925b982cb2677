//! Test support: builds the in-process DOCA *model* (`doca/model/`, a C
//! test double written from the public API reference; not NVIDIA DOCA) so
//! tests can run the wrapper's and the backends' call sequences without
//! DOCA. Used by tests only; it compiles the model with the system C
//! compiler when first asked for.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The folder with `doca/model/build.sh`.
pub fn source_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("model")
}

/// Builds the model libraries into `dir` (needs a C compiler and OpenSSL's
/// libcrypto headers: Debian `build-essential libssl-dev`).
pub fn build(dir: &Path) -> Result<(), ModelBuildError> {
    let script = source_dir().join("build.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg(dir)
        .output()
        .map_err(|source| ModelBuildError::Run { script: script.clone(), source })?;
    if !out.status.success() {
        return Err(ModelBuildError::Failed {
            script,
            status: out.status,
            output: format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)),
        });
    }
    Ok(())
}

/// Why the DOCA model could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ModelBuildError {
    #[error("running {}: {source}", script.display())]
    Run { script: PathBuf, source: std::io::Error },
    #[error("{} failed ({status}):\n{output}", script.display())]
    Failed { script: PathBuf, status: std::process::ExitStatus, output: String },
}

/// The model built once per process into a temporary folder that lives
/// until the process exits. Panics (a test failure) if it cannot be built.
pub fn lib_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("sluice-doca-model-{}", std::process::id()));
        if let Err(e) = build(&dir) {
            panic!("the DOCA model could not be built: {e}");
        }
        dir
    })
}

/// The model loaded through `doca-sys`, as a backend would load DOCA.
pub fn load() -> crate::Lib {
    match crate::load_from(lib_dir()) {
        Ok(lib) => lib,
        Err(e) => panic!("the DOCA model did not load: {e}"),
    }
}
