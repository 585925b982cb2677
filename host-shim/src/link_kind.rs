//! How this shim reaches its agent, remembered for error messages: a failed
//! call says what to check for that kind of link. A domain type at the
//! bottom: [`crate::agent_link`] records the kind when it builds the
//! channel, [`crate::error`] reads it.

use std::sync::atomic::{AtomicU8, Ordering};

/// The kind of link to the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum LinkKind {
    /// A Unix socket (a co-located agent).
    Unix = 0,
    /// Plaintext TCP (`http://`, `insecure`).
    Plaintext = 1,
    /// Mutual TLS (`https://` with `[agent.tls]`).
    Tls = 2,
}

/// The link this shim made (one per process).
static LINK_KIND: AtomicU8 = AtomicU8::new(LinkKind::Unix as u8);

impl LinkKind {
    /// Records the kind of this shim's link.
    pub fn remember(self) {
        LINK_KIND.store(self as u8, Ordering::Relaxed);
    }
}

/// What to add to an error of the link to the agent, by how it is made.
pub fn hint() -> &'static str {
    match LINK_KIND.load(Ordering::Relaxed) {
        1 => " (if the agent's listener uses TLS, dial https:// with [agent.tls])",
        2 => {
            " (over TLS: the agent may have refused this shim's certificate, expired or not signed by its \
             client_ca; the agent logs why)"
        }
        _ => "",
    }
}
