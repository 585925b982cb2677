//! A span of a file as a stream of blocks, read off the async threads: the
//! body of a GET served from a local store file, over HTTP or a one-sided
//! transport.

use std::sync::Arc;

use bytes::Bytes;
use futures::Stream;

/// `len` bytes of `file` from `start`, in blocks of at most `block` bytes.
pub fn span_stream(
    file: std::fs::File,
    start: u64,
    len: u64,
    block: usize,
) -> impl Stream<Item = std::io::Result<Bytes>> + Send + Sync + 'static {
    let file = Arc::new(file);
    futures::stream::try_unfold((file, start, len), move |(file, pos, left)| async move {
        if left == 0 {
            return Ok(None);
        }
        let n = left.min(block as u64) as usize;
        let f = file.clone();
        let buf = tokio::task::spawn_blocking(move || {
            use std::os::unix::fs::FileExt;
            let mut b = vec![0u8; n];
            f.read_exact_at(&mut b, pos).map(|()| b)
        })
        .await
        .map_err(std::io::Error::other)??;
        Ok(Some((Bytes::from(buf), (file, pos + n as u64, left - n as u64))))
    })
}

#[cfg(test)]
mod tests {
    use futures::TryStreamExt;

    #[tokio::test]
    async fn reads_exactly_the_span_in_blocks() {
        let mut f = tempfile_in_tmp();
        let data: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        std::io::Write::write_all(&mut f.0, &data).unwrap();
        let blocks: Vec<_> = super::span_stream(f.0.try_clone().unwrap(), 100, 5000, 1024).try_collect().await.unwrap();
        assert_eq!(blocks.iter().map(|b| b.len()).collect::<Vec<_>>(), [1024, 1024, 1024, 1024, 904]);
        assert_eq!(blocks.concat(), &data[100..5100]);
        // Past the end of the file is an error, not a short stream.
        let r: Result<Vec<_>, _> = super::span_stream(f.0.try_clone().unwrap(), 9000, 2000, 1024).try_collect().await;
        assert!(r.is_err());
        std::fs::remove_file(&f.1).ok();
    }

    fn tempfile_in_tmp() -> (std::fs::File, std::path::PathBuf) {
        let p = std::env::temp_dir().join(format!("sluice-span-{}", std::process::id()));
        (std::fs::OpenOptions::new().create(true).truncate(true).read(true).write(true).open(&p).unwrap(), p)
    }
}
