//! Framed GETs against a scripted GET runner, over real Unix and TCP
//! sockets (plaintext and TLS): each GET gets its own answer, and a peer
//! that breaks the format, sends nothing or stops reading loses its
//! connection and its GETs.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

use bytes::BytesMut;
use futures::StreamExt;
use sluice_proto::agent as pb;
use sluice_proto::common::TransferReport;
use sluice_proto::framed_gets::take_frame;

use super::*;
use crate::get_stream::{GetResult, MAX_GETS_PER_MESSAGE};

/// GETs by key: "hold" never answers (until stopped), "slow" after
/// 300 ms, anything else at once, each with its request id.
/// One test's GETs: "hold" ones started, and GETs stopped unanswered.
#[derive(Default)]
struct Counts {
    held: AtomicUsize,
    slow: AtomicUsize,
    stopped: AtomicUsize,
}

fn runner(counts: &Arc<Counts>) -> RunGet {
    let counts = counts.clone();
    Arc::new(move |_session, item, ctx| {
        let counts = counts.clone();
        Box::pin(async move {
            struct Count(Arc<Counts>, bool);
            impl Drop for Count {
                fn drop(&mut self) {
                    if !self.1 {
                        self.0.stopped.fetch_add(1, SeqCst);
                    }
                }
            }
            let mut c = Count(counts, false);
            match item.key.as_str() {
                "hold" => {
                    c.0.held.fetch_add(1, SeqCst);
                    std::future::pending::<()>().await;
                }
                "slow" => {
                    c.0.slow.fetch_add(1, SeqCst);
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                _ => {}
            }
            c.1 = true;
            let report = TransferReport { request_id: ctx.request_id, ..Default::default() };
            GetResult::Ok(pb::GetReply { report: Some(report), object_size: 0, etag: String::new() })
        })
    })
}

fn gets(keys: &[(u32, &str)]) -> Vec<u8> {
    gets_and_cancels(keys, &[])
}

fn gets_and_cancels(keys: &[(u32, &str)], cancel: &[u32]) -> Vec<u8> {
    let gets = keys
        .iter()
        .map(|(index, key)| {
            let item = pb::GetItem { key: (*key).into(), request_id: format!("r{index}"), ..Default::default() };
            pb::StreamedGet { index: *index, session_id: "s".into(), item: Some(item) }
        })
        .collect();
    let mut out = Vec::new();
    fg::push_gets(&mut out, &pb::GetStreamRequest { gets, cancel: cancel.to_vec() });
    out
}

/// A served connection's shim end (its preface read, as `sort` does),
/// past the agent's answer to it.
async fn connect(counts: &Arc<Counts>) -> UnixStream {
    connect_stopping(counts, None).await
}

/// A served connection with one "hold" GET (index 1) running.
async fn connect_holding(counts: &Arc<Counts>) -> UnixStream {
    let mut shim = connect(counts).await;
    shim.write_all(&gets(&[(1, "hold")])).await.unwrap();
    eventually("the held GET started", || counts.held.load(SeqCst) == 1).await;
    shim
}

async fn connect_stopping(counts: &Arc<Counts>, stop: Option<watch::Receiver<bool>>) -> UnixStream {
    let (mut shim, agent) = UnixStream::pair().unwrap();
    tokio::spawn(serve(agent, runner(counts), stop));
    let mut ack = [0u8; fg::PREFACE.len()];
    shim.read_exact(&mut ack).await.unwrap();
    assert_eq!(&ack, fg::PREFACE);
    shim
}

/// Every byte until the agent closes, as frames.
async fn until_closed(shim: &mut UnixStream) -> Vec<Frame> {
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), shim.read_to_end(&mut raw)).await.expect("closed").unwrap();
    let mut buf = BytesMut::from(&raw[..]);
    let mut frames = Vec::new();
    while let Some(f) = take_frame(&mut buf).unwrap() {
        frames.push(f);
    }
    assert!(buf.is_empty(), "whole frames only");
    frames
}

async fn eventually(what: &str, f: impl Fn() -> bool) {
    let t0 = std::time::Instant::now();
    while !f() {
        assert!(t0.elapsed() < Duration::from_secs(5), "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The next frame from the agent.
async fn next_frame(r: &mut FrameReader<&mut UnixStream>) -> Frame {
    tokio::time::timeout(Duration::from_secs(10), r.next()).await.expect("a frame in time").unwrap().expect("a frame")
}

fn answered(f: Frame) -> (u32, String) {
    match f {
        Frame::Answer(pb::GetManyItem { index, result: Some(GetResult::Ok(r)) }) => {
            (index, r.report.unwrap().request_id)
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn each_get_gets_its_own_answer() {
    let counts = Arc::new(Counts::default());
    let mut shim = connect(&counts).await;
    shim.write_all(&gets(&[(1, "a"), (2, "b")])).await.unwrap();
    shim.write_all(&gets(&[(3, "c")])).await.unwrap();
    let mut r = FrameReader::new(&mut shim);
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(answered(next_frame(&mut r).await));
    }
    got.sort();
    assert_eq!(got, vec![(1, "r1".into()), (2, "r2".into()), (3, "r3".into())]);
    assert_eq!(counts.stopped.load(SeqCst), 0);
}

#[tokio::test]
async fn a_shim_that_closes_its_side_stops_its_gets() {
    let counts = Arc::new(Counts::default());
    let mut shim = connect(&counts).await;
    shim.write_all(&gets(&[(1, "hold"), (2, "hold")])).await.unwrap();
    eventually("both GETs started", || counts.held.load(SeqCst) == 2).await;
    shim.shutdown().await.unwrap();
    assert!(until_closed(&mut shim).await.is_empty(), "nobody to answer");
    eventually("both held GETs stopped", || counts.stopped.load(SeqCst) == 2).await;
}

#[tokio::test]
async fn a_cancel_stops_its_get_and_the_others_go_on() {
    let counts = Arc::new(Counts::default());
    let mut shim = connect_holding(&counts).await;
    shim.write_all(&gets_and_cancels(&[(2, "a")], &[1])).await.unwrap();
    let mut r = FrameReader::new(&mut shim);
    assert_eq!(answered(next_frame(&mut r).await), (2, "r2".into()), "no answer for the cancelled one");
    eventually("the cancelled GET stopped", || counts.stopped.load(SeqCst) == 1).await;
}

#[tokio::test]
async fn an_oversized_frame_closes_the_connection() {
    let counts = Arc::new(Counts::default());
    let mut shim = connect(&counts).await;
    let announced = u32::try_from(fg::MAX_FRAME + 1).unwrap();
    shim.write_all(&announced.to_be_bytes()).await.unwrap();
    assert!(until_closed(&mut shim).await.is_empty());
}

#[tokio::test]
async fn on_the_agents_stop_a_running_get_is_answered_a_new_one_refused_then_the_connection_ends() {
    let counts = Arc::new(Counts::default());
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut shim = connect_stopping(&counts, Some(stop_rx)).await;
    shim.write_all(&gets(&[(1, "slow")])).await.unwrap();
    eventually("the slow GET started", || counts.slow.load(SeqCst) == 1).await;
    stop_tx.send(true).unwrap();
    // The driver looks at the stop before the next message.
    shim.write_all(&gets(&[(2, "a")])).await.unwrap();
    let frames = until_closed(&mut shim).await;
    match frames.as_slice() {
        [Frame::Answer(pb::GetManyItem { index: 2, result: Some(GetResult::Error(d)) }), running] => {
            assert_eq!(d.code, sluice_proto::common::ErrorCode::AgentUnavailable as i32, "{d:?}");
            assert_eq!(answered(running.clone()), (1, "r1".into()), "answered before the connection ends");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(counts.stopped.load(SeqCst), 0);
}

#[tokio::test]
async fn a_malformed_frame_closes_the_connection_and_stops_its_gets() {
    let counts = Arc::new(Counts::default());
    let mut shim = connect_holding(&counts).await;
    // A frame of a kind the agent does not take.
    shim.write_all(&[0, 0, 0, 1, 9]).await.unwrap();
    assert!(until_closed(&mut shim).await.is_empty(), "no answer for the stopped GET");
    eventually("the held GET stopped", || counts.stopped.load(SeqCst) == 1).await;
    // An answer's frame from a shim is refused the same way.
    let counts = Arc::new(Counts::default());
    let mut shim = connect_holding(&counts).await;
    let mut answer = Vec::new();
    fg::push_answer(&mut answer, &pb::GetManyItem { index: 1, result: None });
    shim.write_all(&answer).await.unwrap();
    assert!(until_closed(&mut shim).await.is_empty());
    eventually("the second held GET stopped", || counts.stopped.load(SeqCst) == 1).await;
}

#[tokio::test]
async fn the_streams_own_refusal_reaches_the_shim_as_its_status() {
    let counts = Arc::new(Counts::default());
    let mut shim = connect(&counts).await;
    let too_many: Vec<(u32, &str)> = (0..=MAX_GETS_PER_MESSAGE as u32).map(|i| (i, "a")).collect();
    shim.write_all(&gets(&too_many)).await.unwrap();
    match until_closed(&mut shim).await.as_slice() {
        [Frame::End { code, message }] => {
            assert_eq!(*code, tonic::Code::InvalidArgument as i32);
            assert!(message.contains("GETs"), "{message}");
        }
        other => panic!("{other:?}"),
    }
}

/// A listener's connections through `sort`: (its path, the gRPC ones
/// passed on, how many were served framed, the framed tasks).
async fn sorted(
    dir: &std::path::Path,
    wait: Duration,
    places: usize,
) -> (std::path::PathBuf, ReceiverStream<std::io::Result<UnixStream>>, Arc<AtomicUsize>, TaskTracker) {
    let path = dir.join("agent.sock");
    let l = tokio::net::UnixListener::bind(&path).unwrap();
    let served = Arc::new(AtomicUsize::new(0));
    let count = served.clone();
    let framed = move |_conn| {
        let count = count.clone();
        async move {
            count.fetch_add(1, SeqCst);
        }
    };
    let (grpc, tasks) = sort_within(tokio_stream::wrappers::UnixListenerStream::new(l), framed, wait, places, 4);
    (path, grpc, served, tasks)
}

#[tokio::test]
async fn connections_are_sorted_by_their_first_byte() {
    let dir = tempfile::tempdir().unwrap();
    let (path, mut grpc, served, tasks) = sorted(dir.path(), FIRST_BYTES_WAIT, SORTING).await;
    let mut framed = UnixStream::connect(&path).await.unwrap();
    framed.write_all(fg::PREFACE).await.unwrap();
    let mut h2 = UnixStream::connect(&path).await.unwrap();
    h2.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.unwrap();
    let passed = tokio::time::timeout(Duration::from_secs(5), grpc.next()).await.unwrap().unwrap().unwrap();
    // Nothing of it was read: the gRPC server gets the whole preface.
    let mut first = [0u8; 3];
    passed.try_read(&mut first).unwrap();
    assert_eq!(&first, b"PRI");
    eventually("the framed one served", || served.load(SeqCst) == 1).await;
    // One that closes before a byte, and one whose preface is not ours,
    // are dropped; sorting goes on.
    drop(UnixStream::connect(&path).await.unwrap());
    let mut wrong = UnixStream::connect(&path).await.unwrap();
    wrong.write_all(b"SLUICE-SOMETHING-ELSE/1\n").await.unwrap();
    let mut h2 = UnixStream::connect(&path).await.unwrap();
    h2.write_all(b"Q").await.unwrap();
    let passed = tokio::time::timeout(Duration::from_secs(5), grpc.next()).await.unwrap().unwrap().unwrap();
    let mut first = [0u8; 1];
    passed.readable().await.unwrap();
    passed.try_read(&mut first).unwrap();
    assert_eq!(&first, b"Q", "the next one passed on is the gRPC one");
    assert_eq!(until_closed(&mut wrong).await, vec![], "closed unanswered");
    assert_eq!(served.load(SeqCst), 1);
    // Once the gRPC server is done (its stream dropped), the tracker ends
    // with the framed tasks.
    drop(grpc);
    tokio::time::timeout(Duration::from_secs(5), tasks.wait()).await.expect("the framed tasks ended");
}

#[tokio::test]
async fn a_connection_that_sends_no_whole_preface_is_closed_and_frees_its_place() {
    let dir = tempfile::tempdir().unwrap();
    let wait = Duration::from_millis(300);
    let (path, mut grpc, served, _tasks) = sorted(dir.path(), wait, 4).await;
    let mut silent = Vec::new();
    for i in 0..4 {
        let mut s = UnixStream::connect(&path).await.unwrap();
        // Half send nothing, half the start of the framed preface: both
        // hold their place until the wait ends.
        if i % 2 == 1 {
            s.write_all(&fg::PREFACE[..3]).await.unwrap();
        }
        silent.push(s);
    }
    // All places taken: one more waits in the backlog, then is sorted once
    // the silent ones are closed.
    let mut late = UnixStream::connect(&path).await.unwrap();
    late.write_all(fg::PREFACE).await.unwrap();
    tokio::time::sleep(wait / 2).await;
    assert_eq!(served.load(SeqCst), 0, "waiting for a place");
    for mut s in silent {
        let mut b = [0u8; 1];
        assert_eq!(s.read(&mut b).await.unwrap(), 0, "closed by the agent");
    }
    eventually("the late one served", || served.load(SeqCst) == 1).await;
    assert!(tokio::time::timeout(Duration::from_millis(50), grpc.next()).await.is_err(), "none passed on");
}

#[tokio::test]
async fn the_listeners_wait_ends_once_its_framed_gets_are_answered() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.sock");
    let l = tokio::net::UnixListener::bind(&path).unwrap();
    let counts = Arc::new(Counts::default());
    let (stop_tx, stop_rx) = watch::channel(false);
    let run = runner(&counts);
    let framed = move |conn| serve(conn, run.clone(), Some(stop_rx.clone()));
    let (grpc, tasks) = sort(tokio_stream::wrappers::UnixListenerStream::new(l), framed);
    let mut shim = UnixStream::connect(&path).await.unwrap();
    shim.write_all(fg::PREFACE).await.unwrap();
    let mut ack = [0u8; fg::PREFACE.len()];
    shim.read_exact(&mut ack).await.unwrap();
    shim.write_all(&gets(&[(1, "slow")])).await.unwrap();
    eventually("the slow GET started", || counts.slow.load(SeqCst) == 1).await;
    // The agent stops: the gRPC server drops its connections' stream, and
    // the listener waits for the framed ones.
    stop_tx.send(true).unwrap();
    drop(grpc);
    let waited = tokio::spawn(async move { tokio::time::timeout(Duration::from_secs(10), tasks.wait()).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waited.is_finished(), "the wait holds while the GET runs");
    let frames = until_closed(&mut shim).await;
    assert_eq!(frames.len(), 1, "{frames:?}");
    assert_eq!(answered(frames[0].clone()), (1, "r1".into()));
    waited.await.unwrap().expect("the wait ended with the connection");
}

/// Framed connections' origins, as `serve_framed` takes them.
type Seen = Arc<std::sync::Mutex<Vec<(Option<std::net::SocketAddr>, Option<Arc<crate::tls::ClientCert>>)>>>;

/// A `sort` callback that records each framed connection's origin.
fn recording<C: Conn>(seen: &Seen) -> impl Fn(C) -> std::future::Ready<()> + Clone + Send + 'static {
    let seen = seen.clone();
    move |conn: C| {
        seen.lock().unwrap().push(conn.peer().unwrap());
        std::future::ready(())
    }
}

#[tokio::test]
async fn plaintext_tcp_connections_are_sorted_by_their_first_byte_and_keep_their_address() {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let seen = Seen::default();
    let (mut grpc, _tasks) = sort(tokio_stream::wrappers::TcpListenerStream::new(l), recording(&seen));
    let mut framed = TcpStream::connect(addr).await.unwrap();
    framed.write_all(fg::PREFACE).await.unwrap();
    let mut h2 = TcpStream::connect(addr).await.unwrap();
    h2.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.unwrap();
    let passed = tokio::time::timeout(Duration::from_secs(5), grpc.next()).await.unwrap().unwrap().unwrap();
    let mut first = [0u8; 3];
    let mut passed = passed;
    passed.read_exact(&mut first).await.unwrap();
    assert_eq!(&first, b"PRI", "passed on unread");
    eventually("the framed one served", || seen.lock().unwrap().len() == 1).await;
    let (from, cert) = seen.lock().unwrap()[0].clone();
    assert_eq!(from, Some(framed.local_addr().unwrap()), "its origin is the peer's address");
    assert!(cert.is_none());
}

/// A CA, the agent's certificate (for "localhost") and a client
/// certificate for "alpha", as files: the agent's `[tls]`, and a client
/// config maker offering `alpn`.
fn pki(dir: &std::path::Path) -> (crate::tls::TlsConfig, impl Fn(&[&[u8]]) -> tokio_rustls::TlsConnector) {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(rcgen::DnType::CommonName, "test CA");
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let ca = rcgen::Issuer::new(ca_params, ca_key);
    let agent_key = rcgen::KeyPair::generate().unwrap();
    let agent =
        rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap().signed_by(&agent_key, &ca).unwrap();
    let mut client_params = rcgen::CertificateParams::new(vec!["alpha".to_owned()]).unwrap();
    client_params.distinguished_name.push(rcgen::DnType::CommonName, "alpha");
    let client_key = rcgen::KeyPair::generate().unwrap();
    let client = client_params.signed_by(&client_key, &ca).unwrap();
    let file = |name: &str, pem: String| {
        let p = dir.join(name);
        std::fs::write(&p, pem).unwrap();
        Some(p)
    };
    let cfg = crate::tls::TlsConfig {
        cert: file("agent.crt", agent.pem()),
        key: file("agent.key", agent_key.serialize_pem()),
        client_ca: file("ca.crt", ca_cert.pem()),
        insecure: false,
    };
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca_cert.der().clone()).unwrap();
    let chain: Vec<CertificateDer<'static>> = vec![client.der().clone()];
    let key_der = client_key.serialize_der();
    let connector = move |alpn: &[&[u8]]| {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut c = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots.clone())
            .with_client_auth_cert(chain.clone(), PrivateKeyDer::try_from(key_der.clone()).unwrap())
            .unwrap();
        c.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        tokio_rustls::TlsConnector::from(Arc::new(c))
    };
    (cfg, connector)
}

#[tokio::test]
async fn tls_connections_are_sorted_by_the_protocol_their_handshake_chose() {
    let dir = tempfile::tempdir().unwrap();
    crate::tls::install_crypto_provider();
    let (cfg, connector) = pki(dir.path());
    let acceptor = cfg.acceptor().unwrap().unwrap();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let seen = Seen::default();
    let (mut grpc, _tasks) = sort(crate::tls::incoming(l, acceptor, || {}), recording(&seen));
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let dial = |alpn: &[&[u8]]| {
        let (c, name) = (connector(alpn), name.clone());
        async move { c.connect(name, TcpStream::connect(addr).await.unwrap()).await.unwrap() }
    };
    // A shim that asks for framed GETs (and h2 besides) gets them; the
    // preface follows inside TLS.
    let mut framed = dial(&[fg::ALPN, b"h2"]).await;
    assert_eq!(framed.get_ref().1.alpn_protocol(), Some(fg::ALPN));
    framed.write_all(fg::PREFACE).await.unwrap();
    framed.flush().await.unwrap();
    eventually("the framed one served", || seen.lock().unwrap().len() == 1).await;
    let (from, cert) = seen.lock().unwrap()[0].clone();
    assert_eq!(from, Some(framed.get_ref().0.local_addr().unwrap()));
    assert!(cert.expect("its verified certificate").names.contains(&"alpha".to_owned()));
    // A gRPC client (h2 alone) is passed on, nothing of it read.
    let mut h2 = dial(&[b"h2"]).await;
    assert_eq!(h2.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    h2.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.unwrap();
    h2.flush().await.unwrap();
    let mut passed = tokio::time::timeout(Duration::from_secs(5), grpc.next()).await.unwrap().unwrap().unwrap();
    let mut first = [0u8; 3];
    passed.read_exact(&mut first).await.unwrap();
    assert_eq!(&first, b"PRI");
    // One that asked for framed GETs but says something else is closed.
    let mut wrong = dial(&[fg::ALPN]).await;
    wrong.write_all(b"SLUICE-SOMETHING-ELSE/1\n").await.unwrap();
    wrong.flush().await.unwrap();
    let mut b = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(5), wrong.read(&mut b)).await.expect("closed in time");
    assert!(!matches!(read, Ok(n) if n > 0), "closed unanswered: {read:?}");
    assert_eq!(seen.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn framed_connections_past_the_bound_are_closed_unanswered() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.sock");
    let l = tokio::net::UnixListener::bind(&path).unwrap();
    let held = Arc::new(AtomicUsize::new(0));
    let count = held.clone();
    // Each framed connection served holds its place until its shim closes.
    let framed = move |mut conn: UnixStream| {
        let count = count.clone();
        async move {
            count.fetch_add(1, SeqCst);
            let _ = conn.read_to_end(&mut Vec::new()).await;
        }
    };
    let (_grpc, _tasks) =
        sort_within(tokio_stream::wrappers::UnixListenerStream::new(l), framed, FIRST_BYTES_WAIT, SORTING, 2);
    let mut open = Vec::new();
    for _ in 0..2 {
        let mut c = UnixStream::connect(&path).await.unwrap();
        c.write_all(fg::PREFACE).await.unwrap();
        open.push(c);
    }
    eventually("two served", || held.load(SeqCst) == 2).await;
    let mut third = UnixStream::connect(&path).await.unwrap();
    third.write_all(fg::PREFACE).await.unwrap();
    assert_eq!(until_closed(&mut third).await, vec![], "closed unanswered");
    assert_eq!(held.load(SeqCst), 2);
    // A served one that ends gives its place back.
    drop(open.pop());
    let mut fourth = UnixStream::connect(&path).await.unwrap();
    fourth.write_all(fg::PREFACE).await.unwrap();
    eventually("the fourth served", || held.load(SeqCst) == 3).await;
}

#[test]
fn one_peer_address_takes_at_most_its_share_of_the_places() {
    let serving = Arc::new(Serving::new(4, 2));
    let (a, b): (std::net::IpAddr, std::net::IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
    let a1 = serving.admit(Some(a)).expect("a's first");
    let _a2 = serving.admit(Some(a)).expect("a's second");
    assert!(serving.admit(Some(a)).is_none(), "a's share is taken");
    let _b1 = serving.admit(Some(b)).expect("b is not held back by a");
    let _unix = serving.admit(None).expect("the Unix socket is a peer of its own");
    assert!(serving.admit(Some(b)).is_none(), "all four places taken");
    drop(a1);
    let _a3 = serving.admit(Some(a)).expect("a place given back is a's again");
}

#[tokio::test]
async fn over_tls_every_answer_arrives_though_the_socket_was_full() {
    // Small socket buffers on both ends and a shim that reads late: the
    // agent's writes find the socket full, and what TLS could not send at
    // once must still go out (a write over TLS leaves it in the session's
    // buffer until flushed).
    crate::tls::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let (cfg, connector) = pki(dir.path());
    let acceptor = cfg.acceptor().unwrap().unwrap();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let counts = Arc::new(Counts::default());
    let run = runner(&counts);
    tokio::spawn(async move {
        let (tcp, _) = l.accept().await.unwrap();
        nix::sys::socket::setsockopt(&tcp, nix::sys::socket::sockopt::SndBuf, &4096).unwrap();
        let mut tls = acceptor.accept(tcp).await.unwrap();
        // As `sort` does, the preface is read before the connection is served.
        let mut preface = [0u8; fg::PREFACE.len()];
        tls.read_exact(&mut preface).await.unwrap();
        serve(tls, run, None).await;
    });
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let tcp = socket.connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut shim = connector(&[fg::ALPN]).connect(name, tcp).await.unwrap();
    shim.write_all(fg::PREFACE).await.unwrap();
    shim.flush().await.unwrap();
    let mut ack = [0u8; fg::PREFACE.len()];
    shim.read_exact(&mut ack).await.unwrap();
    // Under the 512 a stream runs at once (an answer not yet written is
    // still running).
    const GETS: u32 = 500;
    for first in (0..GETS).step_by(250) {
        let gets = (first..first + 250)
            .map(|index| {
                // Long request ids (each echoed in its answer): ~130 KiB of
                // answers in all, far more than the sockets hold.
                let request_id = format!("{index:0>250}");
                let item = pb::GetItem { key: "k".into(), request_id, ..Default::default() };
                pb::StreamedGet { index, session_id: "s".into(), item: Some(item) }
            })
            .collect();
        let mut out = Vec::new();
        fg::push_gets(&mut out, &pb::GetStreamRequest { gets, cancel: vec![] });
        shim.write_all(&out).await.unwrap();
    }
    shim.flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut r = FrameReader::new(&mut shim);
    let mut seen = std::collections::HashSet::new();
    while seen.len() < GETS as usize {
        let f = tokio::time::timeout(Duration::from_secs(10), r.next())
            .await
            .unwrap_or_else(|_| panic!("answers stopped at {} of {GETS}", seen.len()))
            .unwrap();
        let Some(f) = f else { panic!("closed after {} answers", seen.len()) };
        let (index, request_id) = answered(f);
        assert_eq!(request_id, format!("{index:0>250}"));
        seen.insert(index);
    }
}
