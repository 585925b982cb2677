//! A reply body, read either as chunks of bytes or straight into host
//! memory.
//!
//! Most readers of a GET body only want its bytes in a region: a body that
//! comes off a socket the agent owns ([`http1`](super::http1)) then lands
//! with one kernel copy, socket to region, instead of socket to a buffer
//! and buffer to region. Bodies that arrive as chunks (reqwest, the test
//! stores, bodies wrapped by fault injection) are copied into the region
//! chunk by chunk, as before. Both feed the part's CRC-64/NVME as they go,
//! from whichever copy of the bytes is cheapest to reach.

use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::{BoxStream, Stream, StreamExt};
use sluice_dataplane::crc64;

use super::error::S3Error;
use crate::hostmem::HostRegion;

/// Where the next bytes of a body go: `region` at `dst`, at most `max`
/// (> 0) of them, each also fed to `digest`.
pub struct Landing<'a> {
    pub region: &'a Arc<dyn HostRegion>,
    pub dst: u64,
    pub max: u64,
    pub digest: &'a mut crc64::Digest,
}

/// What a body is read from.
pub trait BodySource: Send {
    /// The next chunk; `None` at the end of the body.
    fn next_chunk(&mut self) -> BoxFuture<'_, Option<Result<Bytes, S3Error>>>;

    /// Writes the next bytes (at least one, at most `to.max`) into
    /// `to.region`; how many. `Ok(0)`: the body ended.
    fn read_into<'a>(&'a mut self, to: Landing<'a>) -> BoxFuture<'a, Result<u64, S3Error>>;
}

/// A reply body.
pub struct Body(Box<dyn BodySource>);

impl Body {
    /// A body delivered as a stream of chunks.
    pub fn from_stream(stream: impl Stream<Item = Result<Bytes, S3Error>> + Send + 'static) -> Self {
        Self(Box::new(Chunks { stream: stream.boxed(), pending: Bytes::new() }))
    }

    /// A body read from `source`.
    pub fn from_source(source: impl BodySource + 'static) -> Self {
        Self(Box::new(source))
    }

    /// No bytes.
    pub fn empty() -> Self {
        Self::from_stream(futures::stream::empty())
    }

    /// The next chunk; `None` at the end.
    pub async fn next(&mut self) -> Option<Result<Bytes, S3Error>> {
        self.0.next_chunk().await
    }

    /// See [`BodySource::read_into`].
    pub async fn read_into(&mut self, to: Landing<'_>) -> Result<u64, S3Error> {
        self.0.read_into(to).await
    }

    /// The body as a stream of chunks (for wrappers that transform it).
    pub fn into_stream(self) -> BoxStream<'static, Result<Bytes, S3Error>> {
        futures::stream::unfold(self, |mut body| async move { body.next().await.map(|c| (c, body)) }).boxed()
    }
}

/// Chunks from a stream; what a `read_into` did not take waits in `pending`.
struct Chunks {
    stream: BoxStream<'static, Result<Bytes, S3Error>>,
    pending: Bytes,
}

impl BodySource for Chunks {
    fn next_chunk(&mut self) -> BoxFuture<'_, Option<Result<Bytes, S3Error>>> {
        Box::pin(async move {
            if !self.pending.is_empty() {
                return Some(Ok(std::mem::take(&mut self.pending)));
            }
            self.stream.next().await
        })
    }

    fn read_into<'a>(&'a mut self, to: Landing<'a>) -> BoxFuture<'a, Result<u64, S3Error>> {
        Box::pin(async move {
            while self.pending.is_empty() {
                match self.stream.next().await {
                    Some(chunk) => self.pending = chunk?,
                    None => return Ok(0),
                }
            }
            let take = (self.pending.len() as u64).min(to.max) as usize;
            let bytes = self.pending.split_to(take);
            to.region.write_at(to.dst, &bytes).map_err(|e| S3Error::Destination(e.to_string()))?;
            to.digest.update(&bytes);
            Ok(take as u64)
        })
    }
}

/// Reads exactly `len` bytes of `body` into `region` at `dst`; their
/// CRC-64/NVME. Bytes past `len` (a store that ignored Range) stay unread.
pub async fn land(body: &mut Body, region: &Arc<dyn HostRegion>, dst: u64, len: u64) -> Result<u64, S3Error> {
    let mut digest = crc64::digest();
    let mut got = 0u64;
    while got < len {
        let to = Landing { region, dst: dst + got, max: len - got, digest: &mut digest };
        match body.read_into(to).await? {
            0 => {
                return Err(S3Error::TransferFailed {
                    message: format!("body ended after {got} of {len} bytes"),
                    attempts: 1,
                })
            }
            n => got += n,
        }
    }
    Ok(digest.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_dataplane::SharedRegion;

    fn region(len: u64) -> Arc<dyn HostRegion> {
        Arc::new(SharedRegion::new(sluice_shm::MappedRegion::create("body-test", len).unwrap()))
    }

    fn chunks(data: &[u8], size: usize) -> Body {
        let parts: Vec<Result<Bytes, S3Error>> = data.chunks(size).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
        Body::from_stream(futures::stream::iter(parts))
    }

    #[tokio::test]
    async fn a_chunked_body_lands_whole_with_its_crc_and_leaves_the_rest_unread() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + 3) as u8).collect();
        let r = region(16 << 10);
        let mut body = chunks(&data, 3000);
        let crc = land(&mut body, &r, 100, 7001).await.unwrap();
        assert_eq!(crc, crc64::checksum(&data[..7001]));
        let mut out = vec![0u8; 7001];
        r.read_at(100, &mut out).unwrap();
        assert_eq!(out, data[..7001]);
        // The rest of the chunk that was cut comes next, then the rest.
        let mut rest = Vec::new();
        while let Some(c) = body.next().await {
            rest.extend_from_slice(&c.unwrap());
        }
        assert_eq!(rest, data[7001..]);
    }

    #[tokio::test]
    async fn a_short_body_or_a_region_too_small_is_an_error() {
        let r = region(4096);
        let e = land(&mut chunks(&[1u8; 100], 64), &r, 0, 200).await.unwrap_err();
        assert!(matches!(e, S3Error::TransferFailed { .. }), "{e}");
        assert!(e.to_string().contains("100 of 200"), "{e}");
        let e = land(&mut chunks(&[1u8; 5000], 5000), &r, 0, 5000).await.unwrap_err();
        assert!(matches!(e, S3Error::Destination(_)), "{e}");
    }

    #[tokio::test]
    async fn a_stream_error_passes_through() {
        let parts =
            vec![Ok(Bytes::from_static(b"abc")), Err(S3Error::TransferFailed { message: "cut".into(), attempts: 1 })];
        let mut body = Body::from_stream(futures::stream::iter(parts));
        let e = land(&mut body, &region(4096), 0, 10).await.unwrap_err();
        assert!(e.to_string().contains("cut"), "{e}");
    }
}
