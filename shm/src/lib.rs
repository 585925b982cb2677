//! Safe wrapper over the Linux primitives Sluice's co-located memory path uses:
//! memfd shared memory, its mapping, passing file descriptors over Unix
//! sockets (SCM_RIGHTS), and checking descriptors said to be dma-bufs.
//!
//! One of the five crates that may hold `unsafe` (with the bindings, `rdma`
//! and `doca`; docs/architecture.md#unsafe). Every block carries a
//! `// SAFETY:` comment naming the invariant it relies on.

mod dmabuf;
mod fdpass;
mod frames;
mod region;

pub use dmabuf::{check_dmabuf, page_size, DmabufError, DmabufHandOver, DmabufInfo};
pub use fdpass::{recv_with_fds, send_with_fds, shutdown, MAX_FDS_PER_MESSAGE};
pub use frames::{FrameError, FrameReader};
pub use region::{check_sealed, create_memfd, MappedRegion, ShmError};
