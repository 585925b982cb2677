//! `[encryption]`: where tenants' master keys live and which engine seals
//! chunks. Which namespaces are encrypted is each namespace's `encryption`.

use std::path::PathBuf;

use serde::Deserialize;

/// An invalid `[encryption]` section.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EncryptionConfigError {
    #[error("[encryption] engine = \"doca\" needs doca_device = \"<PCI address or mlx5_N>\"")]
    NoDocaDevice,
}

/// Where tenants' master keys live.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EncryptionConfig {
    /// Directory with one subdirectory per tenant holding key files (64 hex
    /// characters, mode 0600, named by key id) and a `current` file naming
    /// the key for new objects. Rotation: add a key, point `current` at it;
    /// old ids stay readable. A key: `head -c 32 /dev/urandom | xxd -p -c 64`.
    pub key_dir: Option<PathBuf>,
    /// Which AES-256-GCM implementation seals and opens chunks: `ring` (the
    /// CPU; default) or `doca` (the BlueField-3 crypto engine; needs an
    /// agent built with the `doca` feature). The stored format is the same.
    #[serde(default)]
    pub engine: CipherEngine,
    /// With `engine = "doca"`: the device (PCI address or `mlx5_N`).
    #[serde(default)]
    pub doca_device: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CipherEngine {
    #[default]
    Ring,
    Doca,
}

impl EncryptionConfig {
    pub fn validate(&self) -> Result<(), EncryptionConfigError> {
        if self.engine == CipherEngine::Doca && self.doca_device.is_none() {
            return Err(EncryptionConfigError::NoDocaDevice);
        }
        Ok(())
    }
}
