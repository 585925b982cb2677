//! The one-sided transport abstraction.
//!
//! The **memory owner** (the agent, for a host region or a staging buffer)
//! exposes a window and gets a descriptor ([`Token`]) to send in
//! `x-amz-rdma-token`; the **remote** (the storage gateway) performs WRITE
//! (for a GET) or READ (for a PUT) against that descriptor. Providers: `tcp`
//! (software, any machine), verbs RC and mlx5 DC (hardware, later).

use std::sync::Arc;
use std::time::Duration;

use crate::capability::Grant;
use crate::landing::{Landing, Unsettled};
use crate::token::Token;

/// Largest single one-sided operation (the protocol's limit); larger
/// transfers are split into pieces of at most this size.
pub const MAX_OP_BYTES: u64 = 1 << 30;
/// Largest window one descriptor can describe (32-bit size field, minus the
/// 64 KiB peers reserve).
pub const MAX_WINDOW_BYTES: u64 = (4 << 30) - (64 << 10);

/// Which provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TransportKind {
    /// Software one-sided semantics over TCP. Its descriptors look like
    /// standard tokens but only Sluice gateways configured for `tcp` can
    /// serve them; they are sent with `x-sluice-rdma-transport: tcp`.
    #[default]
    Tcp,
    /// Verbs reliable connection (Soft-RoCE and real NICs).
    VerbsRc,
    /// mlx5 Dynamically Connected: the standard token every peer speaks.
    Dc,
}

impl TransportKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::VerbsRc => "verbs-rc",
            Self::Dc => "dc",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "tcp" => Some(Self::Tcp),
            "verbs-rc" => Some(Self::VerbsRc),
            "dc" => Some(Self::Dc),
            _ => None,
        }
    }

    /// The value of `x-sluice-rdma-transport` that marks a non-standard
    /// descriptor, or `None` for the standard DC token.
    pub fn marker(&self) -> Option<&'static str> {
        match self {
            Self::Dc => None,
            other => Some(other.as_str()),
        }
    }
}

/// A transport name that is none of `tcp`, `verbs-rc`, `dc`.
#[derive(Debug, thiserror::Error)]
#[error("unknown transport {0:?} (use \"tcp\", \"verbs-rc\" or \"dc\")")]
pub struct UnknownTransport(pub String);

impl std::str::FromStr for TransportKind {
    type Err = UnknownTransport;
    fn from_str(s: &str) -> Result<Self, UnknownTransport> {
        Self::parse(s).ok_or_else(|| UnknownTransport(s.to_owned()))
    }
}

impl std::fmt::Display for TransportKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a provider can do, so the agent knows what it may offer an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    pub kind: TransportKind,
    /// Whether standard S3-over-RDMA servers understand its descriptors.
    pub standard_token: bool,
    /// Largest single operation.
    pub max_op_bytes: u64,
    /// Largest window per descriptor.
    pub max_window_bytes: u64,
}

/// Errors of the transport layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    #[error("window of {0} bytes exceeds what one descriptor can describe")]
    WindowTooLarge(u64),
    #[error("the memory owner refused the access: {0}")]
    Rejected(String),
    #[error("transport I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("transport protocol: {0}")]
    Protocol(String),
    #[error("{0}")]
    Unsupported(String),
}

/// A window made reachable: the descriptor to send, and the grant behind it
/// (revoked when this is dropped: a capability-table entry for
/// `tcp`, the window's own memory registration for verbs).
pub struct Exposure {
    pub token: Token,
    pub guard: Box<dyn std::any::Any + Send + Sync>,
    /// What the owner saw land in the window, where the owner moves the
    /// bytes itself (`tcp`); `None` where a NIC does (see [`Landing`]).
    pub landing: Option<Arc<Landing>>,
}

impl Exposure {
    /// Waits (at most `wait`) until the first `bytes` of the window, which
    /// the remote said it wrote, have landed. Where a NIC moves the bytes,
    /// the remote's word is enough (an RC WRITE completes at the owner
    /// before the remote sees its completion). Dropping the exposure
    /// revokes the window: no byte lands after that.
    pub async fn settle(&self, bytes: u64, wait: Duration) -> Result<(), Unsettled> {
        match &self.landing {
            Some(l) => l.settle(bytes, wait).await,
            None => Ok(()),
        }
    }

    /// Revokes the window (no operation starts on it after this; one under
    /// way has ended) and says whether the bytes that settled are still
    /// the ones the window holds: `Err(Unsettled::Late)` if an operation
    /// began after they settled (a late or repeated WRITE, from whoever
    /// held the descriptor) and may have changed them.
    pub fn close(self) -> Result<(), Unsettled> {
        let landing = self.landing.clone();
        drop(self);
        match landing {
            Some(l) if l.began_after_settling() => Err(Unsettled::Late),
            _ => Ok(()),
        }
    }
}

impl std::fmt::Debug for Exposure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exposure").field("token", &self.token).finish_non_exhaustive()
    }
}

/// The owner side of a transport.
pub trait Transport: Send + Sync {
    fn capabilities(&self) -> Capabilities;
    /// Exposes `grant` to remote one-sided access.
    fn expose(&self, grant: Grant) -> Result<Exposure, TransportError>;
}
