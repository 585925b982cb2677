//! The direct GET client against a scripted HTTP/1.1 server on loopback.

use std::sync::atomic::{AtomicUsize, Ordering};

use sluice_dataplane::{crc64, CopiedRegion, SharedRegion};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;
use crate::hostmem::HostRegion;

/// What the server does with one request: the bytes it answers, and
/// whether it closes the connection afterwards.
type Script = Arc<dyn Fn(usize, &str) -> (Vec<u8>, bool) + Send + Sync>;

/// A server answering each request head by `script` (its index over all
/// connections, the head); the connections it accepted.
async fn serve(script: Script) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (conns, requests) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let accepted = conns.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else { return };
            accepted.fetch_add(1, Ordering::SeqCst);
            let (script, requests) = (script.clone(), requests.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let mut chunk = [0u8; 4096];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match sock.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
                    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                    buf.drain(..end);
                    let (reply, close) = script(requests.fetch_add(1, Ordering::SeqCst), &head);
                    // Written in pieces, as a store streaming a body would.
                    for piece in reply.chunks(7000) {
                        if sock.write_all(piece).await.is_err() {
                            return;
                        }
                    }
                    if close {
                        return;
                    }
                }
            });
        }
    });
    (addr, conns)
}

fn ok(body: &[u8], extra_headers: &str) -> Vec<u8> {
    let mut r = format!(
        "HTTP/1.1 206 Partial Content\r\ncontent-length: {}\r\netag: \"e1\"\r\n{extra_headers}\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body);
    r
}

fn data(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn region(len: u64) -> Arc<dyn HostRegion> {
    Arc::new(SharedRegion::new(sluice_shm::MappedRegion::create("http1-test", len).unwrap()))
}

fn request<'a>(addr: &'a str, endpoint: &'a str, first_byte: Option<Duration>) -> Request<'a> {
    let head = format!("GET /b/k HTTP/1.1\r\nhost: {addr}\r\n\r\n").into_bytes();
    Request { endpoint, authority: addr, head, asked: 1 << 20, first_byte, no_body: false }
}

fn client() -> Arc<Http1> {
    Http1::new(Duration::from_secs(2), Duration::from_secs(2))
}

#[tokio::test]
async fn bodies_land_in_the_region_from_the_socket_over_one_kept_alive_connection() {
    let bodies = [data(300_000, 1), data(4096, 2)];
    let served = bodies.clone();
    let (addr, conns) = serve(Arc::new(move |i, _| (ok(&served[i % 2], ""), false))).await;
    let (c, r) = (client(), region(1 << 20));
    for (i, want) in bodies.iter().enumerate() {
        let resp = c.get(request(&addr, "http://store", None)).await.unwrap();
        assert_eq!(resp.status, http::StatusCode::PARTIAL_CONTENT);
        assert_eq!(resp.headers.get("etag").unwrap(), "\"e1\"");
        let mut body = resp.body;
        let crc = super::super::body::land(&mut body, &r, 100, want.len() as u64).await.unwrap();
        assert_eq!(crc, crc64::checksum(want), "GET {i}");
        let mut got = vec![0u8; want.len()];
        r.read_at(100, &mut got).unwrap();
        assert_eq!(&got, want, "GET {i}");
        assert!(body.next().await.is_none(), "the body is over");
    }
    assert_eq!(conns.load(Ordering::SeqCst), 1, "the second GET reused the connection");
    assert_eq!(c.idle_count(), 1);
}

#[tokio::test]
async fn a_head_answer_has_no_body_whatever_its_length_says() {
    // The object's length, and no body: the connection is at once reusable.
    let (addr, conns) =
        serve(Arc::new(|_, _| (b"HTTP/1.1 200 OK\r\ncontent-length: 12345\r\netag: \"e\"\r\n\r\n".to_vec(), false)))
            .await;
    let c = client();
    for _ in 0..2 {
        let mut req = request(&addr, "http://store", None);
        req.no_body = true;
        let resp = c.get(req).await.unwrap();
        assert_eq!(resp.headers.get("content-length").unwrap(), "12345");
        let mut body = resp.body;
        assert!(body.next().await.is_none());
        assert_eq!(c.idle_count(), 1);
    }
    assert_eq!(conns.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_body_read_as_chunks_is_the_same_bytes() {
    let body = data(100_000, 9);
    let served = body.clone();
    let (addr, _) = serve(Arc::new(move |_, _| (ok(&served, ""), false))).await;
    let mut got = Vec::new();
    let mut b = client().get(request(&addr, "http://store", None)).await.unwrap().body;
    while let Some(c) = b.next().await {
        got.extend_from_slice(&c.unwrap());
    }
    assert_eq!(got, body);
}

#[tokio::test]
async fn a_pooled_connection_the_store_closed_is_replaced_once() {
    // Every answer closes its connection, as a store timing idle ones out.
    let (addr, conns) = serve(Arc::new(|_, _| (ok(b"hello", "connection: keep-alive\r\n"), true))).await;
    let c = client();
    for _ in 0..3 {
        let mut b = c.get(request(&addr, "http://store", None)).await.unwrap().body;
        assert_eq!(&b.next().await.unwrap().unwrap()[..], b"hello");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(conns.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn connection_close_and_extra_bytes_keep_a_connection_out_of_the_pool() {
    let (addr, _) = serve(Arc::new(|i, _| {
        if i == 0 {
            (ok(b"abc", "connection: close\r\n"), false)
        } else {
            // Five bytes more than the length says.
            let mut r = ok(b"0123456789", "");
            r.extend_from_slice(b"XXXXX");
            (r, false)
        }
    }))
    .await;
    let (c, r) = (client(), region(4096));
    for len in [3, 10] {
        let mut b = c.get(request(&addr, "http://store", None)).await.unwrap().body;
        super::super::body::land(&mut b, &r, 0, len).await.unwrap();
        drop(b);
        assert_eq!(c.idle_count(), 0, "a {len}-byte body");
    }
}

#[tokio::test]
async fn a_body_cut_short_fails_the_transfer() {
    let (addr, _) = serve(Arc::new(|_, _| {
        let mut r = b"HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\n".to_vec();
        r.extend_from_slice(&data(50_000, 3));
        (r, true)
    }))
    .await;
    let mut b = client().get(request(&addr, "http://store", None)).await.unwrap().body;
    let e = super::super::body::land(&mut b, &region(1 << 20), 0, 100_000).await.unwrap_err();
    assert!(matches!(e, S3Error::TransferFailed { .. }), "{e}");
    assert!(e.is_retryable());
    assert!(e.to_string().contains("body bytes still to come"), "{e}");
}

#[tokio::test]
async fn error_replies_are_read_whole_chunked_or_not() {
    let xml = "<Error><Code>NoSuchKey</Code><Message>gone</Message></Error>";
    let (addr, conns) = serve(Arc::new(move |i, _| {
        let r = if i == 0 {
            // Chunked, with an extension and a trailer, split mid-chunk.
            format!(
                "HTTP/1.1 404 Not Found\r\ntransfer-encoding: chunked\r\n\r\n10;x=y\r\n{}\r\n{:x}\r\n{}\r\n0\r\nx-t: 1\r\n\r\n",
                &xml[..16],
                xml.len() - 16,
                &xml[16..]
            )
        } else {
            format!("HTTP/1.1 403 Forbidden\r\ncontent-length: {}\r\n\r\n{xml}", xml.len())
        };
        (r.into_bytes(), false)
    }))
    .await;
    let c = client();
    for status in [404, 403] {
        let resp = c.get(request(&addr, "http://store", None)).await.unwrap();
        assert_eq!(resp.status.as_u16(), status);
        let mut b = resp.body;
        let mut got = Vec::new();
        while let Some(chunk) = b.next().await {
            got.extend_from_slice(&chunk.unwrap());
        }
        assert_eq!(String::from_utf8(got).unwrap(), xml, "{status}");
    }
    assert_eq!(conns.load(Ordering::SeqCst), 1, "both replies were read to the end");
}

#[tokio::test]
async fn silence_before_the_head_is_a_deadline_naming_the_endpoint() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let _hold = tokio::spawn(async move {
        let (_sock, _) = listener.accept().await.unwrap();
        futures::future::pending::<()>().await
    });
    let e = client().get(request(&addr, "http://slow", Some(Duration::from_millis(200)))).await.err().unwrap();
    assert!(matches!(e, S3Error::Connection { .. }), "{e}");
    assert!(e.to_string().contains("http://slow"), "{e}");
    assert_eq!(super::super::endpoints::classify(&e), Some(super::super::endpoints::FailureKind::Deadline), "{e}");
}

#[tokio::test]
async fn a_body_that_stalls_fails_at_the_read_timeout() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let _hold = tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        let mut buf = [0u8; 4096];
        let _ = sock.read(&mut buf).await;
        sock.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\n").await.unwrap();
        sock.write_all(&data(30_000, 1)).await.unwrap();
        futures::future::pending::<()>().await
    });
    let c = Http1::new(Duration::from_secs(2), Duration::from_millis(300));
    let mut b = c.get(request(&addr, "http://stuck", None)).await.unwrap().body;
    let started = std::time::Instant::now();
    let e = super::super::body::land(&mut b, &region(1 << 20), 0, 100_000).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    assert_eq!(super::super::endpoints::classify(&e), Some(super::super::endpoints::FailureKind::Deadline), "{e}");
    assert!(e.to_string().contains("http://stuck"), "{e}");
    assert_eq!(c.idle_count(), 0);
}

#[tokio::test]
async fn a_refused_connection_is_a_connection_error() {
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let e = client().get(request(&addr, "http://gone", None)).await.err().unwrap();
    assert!(matches!(e, S3Error::Connection { .. }) && e.to_string().contains("http://gone"), "{e}");
}

#[tokio::test]
async fn replies_that_cannot_be_framed_count_against_the_endpoint() {
    // As reqwest reported them: a broken endpoint, retried elsewhere.
    for reply in [
        &b"HTTP/1.1 2000 Nope\r\n\r\n"[..],
        b"HTTP/1.1 200 OK\r\ncontent-length: ten\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\ncontent-length: 11\r\n\r\n0123456789",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n",
        // Chunked then gzip, over two headers or in one.
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntransfer-encoding: gzip\r\n\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked, gzip\r\n\r\n0\r\n\r\n",
        // Both framings: which one holds is a guess.
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n5\r\nabcde\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: \xffchunked\r\n\r\n0\r\n\r\n",
        b"HTTP/1.1 101 Switching Protocols\r\nupgrade: h2c\r\n\r\n",
        b"SSH-2.0-OpenSSH\r\n\r\n",
    ] {
        let (addr, _) = serve(Arc::new(move |_, _| (reply.to_vec(), false))).await;
        let e = client().get(request(&addr, "http://odd", None)).await.err().unwrap();
        let what = String::from_utf8_lossy(reply);
        assert!(e.is_retryable() && e.to_string().contains("http://odd"), "{what:?}: {e}");
        assert_eq!(
            super::super::endpoints::classify(&e),
            Some(super::super::endpoints::FailureKind::Broken),
            "{what:?}: {e}"
        );
    }
}

#[tokio::test]
async fn endless_chunked_trailers_fail_the_transfer() {
    // The last chunk, then trailer lines that never end with an empty one.
    let (addr, _) = serve(Arc::new(move |_, _| {
        let mut reply = b"HTTP/1.1 404 Not Found\r\ntransfer-encoding: chunked\r\n\r\n0\r\n".to_vec();
        for i in 0..2000 {
            reply.extend_from_slice(format!("x-trailer-{i}: yes\r\n").as_bytes());
        }
        (reply, true)
    }))
    .await;
    let e = client().get(request(&addr, "http://odd", None)).await.err().unwrap();
    assert!(matches!(&e, S3Error::TransferFailed { message, .. } if message.contains("trailers")), "{e}");
}

#[tokio::test]
async fn absurd_chunk_sizes_fail_the_transfer_without_a_panic() {
    for size in ["fffffffffffffffe", "ffffffffffffffffff", "10000000000"] {
        let (addr, _) = serve(Arc::new(move |_, _| {
            (format!("HTTP/1.1 404 Not Found\r\ntransfer-encoding: chunked\r\n\r\n{size}\r\nxx").into_bytes(), true)
        }))
        .await;
        let e = client().get(request(&addr, "http://odd", None)).await.err().unwrap();
        assert!(matches!(e, S3Error::TransferFailed { .. }), "{size}: {e}");
    }
}

#[tokio::test]
async fn an_idle_connection_with_bytes_nobody_asked_for_is_not_reused() {
    // After its answer the store sends a second one, late, on the idle
    // connection: it must never be read as the answer to the next GET.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let conns = Arc::new(AtomicUsize::new(0));
    let accepted = conns.clone();
    let _server = tokio::spawn(async move {
        loop {
            let (mut sock, _) = listener.accept().await.unwrap();
            let first = accepted.fetch_add(1, Ordering::SeqCst) == 0;
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                while sock.read(&mut buf).await.unwrap_or(0) > 0 {
                    sock.write_all(&ok(b"fresh", "")).await.unwrap();
                    if first {
                        tokio::time::sleep(Duration::from_millis(30)).await;
                        sock.write_all(&ok(b"stale", "")).await.unwrap();
                    }
                }
            });
        }
    });
    let c = client();
    for _ in 0..2 {
        let mut b = c.get(request(&addr, "http://store", None)).await.unwrap().body;
        assert_eq!(&b.next().await.unwrap().unwrap()[..], b"fresh");
        assert!(b.next().await.is_none());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(conns.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn bodyless_statuses_and_connection_tokens_frame_as_the_rfc_says() {
    let (addr, conns) = serve(Arc::new(|i, _| {
        let r: &[u8] = match i {
            // A length on a 304 describes the object, not a body.
            0 => b"HTTP/1.1 304 Not Modified\r\ncontent-length: 1234\r\n\r\n",
            _ => b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: keep-alive, close\r\n\r\nok",
        };
        (r.to_vec(), false)
    }))
    .await;
    let c = client();
    let resp = tokio::time::timeout(Duration::from_secs(1), c.get(request(&addr, "http://store", None)))
        .await
        .expect("a 304 waits for no body")
        .unwrap();
    assert_eq!(resp.status.as_u16(), 304);
    assert_eq!(c.idle_count(), 1);
    let mut b = c.get(request(&addr, "http://store", None)).await.unwrap().body;
    assert_eq!(&b.next().await.unwrap().unwrap()[..], b"ok");
    assert!(b.next().await.is_none());
    assert_eq!(c.idle_count(), 0, "\"close\" among the tokens");
    assert_eq!(conns.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_long_error_reply_is_cut_at_64_kib_and_still_an_answer() {
    let (addr, _) = serve(Arc::new(|_, _| {
        let mut r = b"HTTP/1.1 503 Slow Down\r\n\r\n".to_vec();
        r.extend_from_slice(&[b'x'; 200_000]);
        (r, true)
    }))
    .await;
    let resp = client().get(request(&addr, "http://store", None)).await.unwrap();
    assert_eq!(resp.status.as_u16(), 503);
    let mut b = resp.body;
    assert_eq!(b.next().await.unwrap().unwrap().len(), MAX_WHOLE);
}

#[tokio::test]
async fn memory_that_is_not_mapped_gets_copies_checksummed_on_the_way() {
    let body = data(700_000, 5);
    let served = body.clone();
    let (addr, _) = serve(Arc::new(move |_, _| (ok(&served, ""), false))).await;
    let r: Arc<dyn HostRegion> = Arc::new(CopiedRegion::new(vec![0; 800_000]));
    let mut b = client().get(request(&addr, "http://store", None)).await.unwrap().body;
    let crc = super::super::body::land(&mut b, &r, 9, body.len() as u64).await.unwrap();
    assert_eq!(crc, crc64::checksum(&body));
    let mut got = vec![0u8; body.len()];
    r.read_at(9, &mut got).unwrap();
    assert_eq!(got, body);
}

#[tokio::test]
async fn a_region_too_small_is_refused_before_reading_into_it() {
    let (addr, _) = serve(Arc::new(|_, _| (ok(&data(200_000, 1), ""), false))).await;
    let mut b = client().get(request(&addr, "http://store", None)).await.unwrap().body;
    let e = super::super::body::land(&mut b, &region(100_000), 0, 200_000).await.unwrap_err();
    assert!(matches!(e, S3Error::Destination(_)), "{e}");
}

#[test]
fn chunked_bodies_decode_across_reads() {
    let wire = b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\ntrailer: x\r\n\r\n";
    for split in 1..wire.len() {
        let (mut raw, mut out) = (BytesMut::new(), BytesMut::new());
        raw.extend_from_slice(&wire[..split]);
        let done = dechunk(&mut raw, &mut out).unwrap();
        assert!(!done || split == wire.len(), "{split}");
        raw.extend_from_slice(&wire[split..]);
        assert!(dechunk(&mut raw, &mut out).unwrap(), "{split}");
        assert_eq!(&out[..], b"hello world");
        assert!(raw.is_empty());
    }
    let mut huge = BytesMut::from(&b"fffffffffffffffe\r\nxx"[..]);
    assert!(dechunk(&mut huge, &mut BytesMut::new()).is_err());
    let mut bad = BytesMut::from(&b"zz\r\n"[..]);
    assert!(dechunk(&mut bad, &mut BytesMut::new()).is_err());
    let mut no_crlf = BytesMut::from(&b"2\r\nabXY"[..]);
    assert!(dechunk(&mut no_crlf, &mut BytesMut::new()).is_err());
}

#[test]
fn authorities_with_and_without_ports() {
    assert!(has_port("127.0.0.1:9000"));
    assert!(has_port("[::1]:9000"));
    assert!(!has_port("store.example"));
    assert!(!has_port("[::1]"));
}

mod wire {
    //! What a store sends is input like any other: no reply may panic the
    //! parser, and whatever it accepts is what was framed.
    use bytes::BytesMut;
    use proptest::prelude::*;

    use super::super::{dechunk, parse_head};

    fn chunked(body: &[u8], sizes: &[usize]) -> Vec<u8> {
        let mut out = Vec::new();
        let (mut at, mut i) = (0, 0);
        while at < body.len() {
            let n = sizes[i % sizes.len()].min(body.len() - at);
            out.extend_from_slice(format!("{n:x}\r\n").as_bytes());
            out.extend_from_slice(&body[at..at + n]);
            out.extend_from_slice(b"\r\n");
            at += n;
            i += 1;
        }
        out.extend_from_slice(b"0\r\n\r\n");
        out
    }

    proptest! {
        #[test]
        fn any_bytes_as_a_head_are_parsed_or_refused(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            if let Ok(Some((_, len))) = parse_head(&bytes) {
                prop_assert!(len <= bytes.len());
            }
        }

        #[test]
        fn any_bytes_as_chunks_decode_to_no_more_than_they_hold(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let (mut raw, mut out) = (BytesMut::from(&bytes[..]), BytesMut::new());
            let _ = dechunk(&mut raw, &mut out);
            prop_assert!(out.len() <= bytes.len());
        }

        #[test]
        fn chunked_bodies_decode_whatever_the_reads(
            body in proptest::collection::vec(any::<u8>(), 0..4096),
            sizes in proptest::collection::vec(1usize..700, 1..6),
            cuts in proptest::collection::vec(1usize..300, 1..8),
        ) {
            let wire = chunked(&body, &sizes);
            let (mut raw, mut out, mut at, mut i, mut done) = (BytesMut::new(), BytesMut::new(), 0, 0, false);
            while !done {
                prop_assert!(at < wire.len() || !raw.is_empty(), "ran out of input undecoded");
                let n = cuts[i % cuts.len()].min(wire.len() - at);
                raw.extend_from_slice(&wire[at..at + n]);
                at += n;
                i += 1;
                done = dechunk(&mut raw, &mut out).unwrap();
                if at == wire.len() && !done {
                    prop_assert!(false, "complete input not decoded");
                }
            }
            prop_assert_eq!(&out[..], &body[..]);
            prop_assert!(raw.is_empty());
        }

        #[test]
        fn well_formed_heads_keep_their_status_and_headers(
            status in 200u16..600,
            values in proptest::collection::vec("[ -~]{0,40}", 0..12),
            body in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let mut head = format!("HTTP/1.1 {status} Whatever\r\n");
            for (i, v) in values.iter().enumerate() {
                head.push_str(&format!("x-h{i}: {v}\r\n"));
            }
            head.push_str("\r\n");
            let mut wire = head.clone().into_bytes();
            wire.extend_from_slice(&body);
            let (h, len) = parse_head(&wire).unwrap().unwrap();
            prop_assert_eq!(len, head.len());
            prop_assert_eq!(h.status.as_u16(), status);
            for (i, v) in values.iter().enumerate() {
                prop_assert_eq!(h.headers.get(format!("x-h{i}")).unwrap().to_str().unwrap(), v.trim());
            }
            // Every prefix short of the whole head asks for more bytes.
            for cut in [0, 1, head.len() / 2, head.len() - 1] {
                prop_assert!(parse_head(&wire[..cut]).unwrap().is_none(), "cut at {}", cut);
            }
        }
    }
}

#[tokio::test]
async fn idle_connections_to_a_store_nobody_reads_from_are_swept() {
    use std::collections::HashMap;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut idle: HashMap<usize, super::IdleByAuthority> = HashMap::new();
    let now = std::time::Instant::now();
    for (core, store, age) in [(0, "old:80", 30), (0, "fresh:80", 1), (1, "old:80", 25), (1, "fresh:80", 30)] {
        let conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        let since = now.checked_sub(Duration::from_secs(age)).unwrap();
        idle.entry(core).or_default().entry(store.to_owned()).or_default().push((conn, since));
    }
    super::sweep(&mut idle, now);
    // Only core 0's fresh one is left; a store with none is forgotten.
    assert_eq!(idle[&0].keys().collect::<Vec<_>>(), ["fresh:80"]);
    assert!(idle[&1].is_empty());
}
