//! The shim's side of framed GETs (`sluice_proto::framed_gets`): a GET
//! stream to the agent on a connection of its own, without HTTP/2: on the
//! agent's Unix socket (a co-located agent), or on its TCP address, with
//! the link's mutual TLS where it has it (an agent on a BlueField).
//! `get_stream.rs` decides when to use it and answers the GETs; this opens
//! the connection and turns it into the same two halves a `GetStream` call
//! has: messages out, answers (then why it ended) in.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use sluice_proto::agent as apb;
use sluice_proto::framed_gets::{self as fg, Frame, FrameReader};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};

use crate::config::AgentTlsPem;
use crate::error::StartupError;

/// Longest connecting (and TLS's handshake) and the agent's answer to the
/// preface may take.
const OPEN_WAIT: Duration = Duration::from_secs(5);
/// Longest one of the agent's addresses is tried before the next (the
/// gRPC channel moves on after 300 ms, to the other address family).
const PER_ADDRESS_WAIT: Duration = Duration::from_secs(1);
/// Longest one write of GETs may wait for the agent to take them; past
/// it the connection is given up (its GETs fail, the next opens another).
const WRITE_WAIT: Duration = Duration::from_secs(30);

/// Where framed GETs go: the agent's own address, as the gRPC link's.
pub enum Target {
    Unix(PathBuf),
    Tcp {
        /// `host:port`, resolved at each connection as the gRPC link does.
        address: String,
        /// The link's mutual TLS; `None` for plaintext (`insecure`).
        tls: Option<(tokio_rustls::TlsConnector, rustls::pki_types::ServerName<'static>)>,
    },
}

impl Target {
    /// The target of a TCP link to `uri` (an `http(s)://host:port`
    /// address, `tls` for `https`). Made for every TCP link, framed GETs
    /// on or not: rustls checks here what tonic takes on trust until the
    /// first handshake (a CA file with no usable certificate, a server
    /// name that cannot be one), so such a shim does not start.
    pub fn tcp(uri: &tonic::codegen::http::Uri, tls: Option<&AgentTlsPem>) -> Result<Self, StartupError> {
        let host = uri.host().ok_or_else(|| StartupError::AgentHost(uri.to_string()))?;
        // The port the gRPC channel dials: the scheme's when none is given.
        let port = uri.port_u16().unwrap_or(if uri.scheme_str() == Some("https") { 443 } else { 80 });
        // `[::1]` in a URI, `::1` to resolve and as a name.
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let address = if bare.contains(':') { format!("[{bare}]:{port}") } else { format!("{bare}:{port}") };
        let tls = match tls {
            None => None,
            Some(t) => {
                let name = t.files.server_name.clone().unwrap_or_else(|| bare.to_owned());
                let name = rustls::pki_types::ServerName::try_from(name.clone())
                    .map_err(|e| StartupError::Tls(format!("server name {name:?}: {e}")))?;
                Some((client_tls(t)?, name))
            }
        };
        Ok(Self::Tcp { address, tls })
    }

    fn describe(&self) -> String {
        match self {
            Self::Unix(p) => format!("agent socket {}", p.display()),
            Self::Tcp { address, .. } => format!("agent at {address}"),
        }
    }
}

/// The link's mutual TLS for framed connections: the agent's certificate
/// checked against `ca`, ours presented, framed GETs asked for first and
/// `h2` besides, so an agent that does not serve them chooses `h2` (and
/// says so) rather than failing the handshake.
fn client_tls(pem: &AgentTlsPem) -> Result<tokio_rustls::TlsConnector, StartupError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let f = &pem.files;
    let fail = |what: &str, p: &std::path::Path, e: &dyn std::fmt::Display| {
        StartupError::Tls(format!("{what} {}: {e}", p.display()))
    };
    // As the gRPC link reads it: certificates that do not parse are
    // skipped, not fatal; but with none left it could verify no agent.
    let mut roots = rustls::RootCertStore::empty();
    let cas: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(&pem.ca).collect::<Result<_, _>>().map_err(|e| fail("ca", &f.ca, &e))?;
    let (usable, _) = roots.add_parsable_certificates(cas);
    if usable == 0 {
        return Err(fail("ca", &f.ca, &"no usable CA certificate"));
    }
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(&pem.cert).collect::<Result<_, _>>().map_err(|e| fail("cert", &f.cert, &e))?;
    if chain.is_empty() {
        return Err(fail("cert", &f.cert, &"no certificate"));
    }
    let key = PrivateKeyDer::from_pem_slice(&pem.key).map_err(|e| fail("key", &f.key, &e))?;
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| StartupError::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(|e| fail("cert and key", &f.cert, &e))?;
    config.alpn_protocols = vec![fg::ALPN.to_vec(), b"h2".to_vec()];
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// A framed connection's two halves.
pub struct Halves {
    rd: Box<dyn AsyncRead + Send + Unpin>,
    wr: Box<dyn AsyncWrite + Send + Unpin>,
}

/// What opening a framed connection came to.
pub enum Opened {
    Framed(Halves),
    /// The agent answered, but not with the preface: it does not serve
    /// framed GETs (an older agent's HTTP/2 server sends its settings, then
    /// closes; over TLS, an older agent chooses `h2`).
    NotServed(String),
    /// No answer, or one cut short with every byte of it right (no agent, a
    /// full backlog, an agent stopping): this stream goes as a call, and the
    /// next tries framing again.
    Failed(String),
}

/// Connects to the agent at `to` and says the preface.
pub async fn open(to: &Target) -> Opened {
    match tokio::time::timeout(OPEN_WAIT, open_now(to)).await {
        Ok(o) => o,
        Err(_) => Opened::Failed(format!("no answer to the framed preface in {OPEN_WAIT:?}")),
    }
}

async fn open_now(to: &Target) -> Opened {
    let at = to.describe();
    let failed = |e: std::io::Error| Opened::Failed(format!("{at}: {e}"));
    match to {
        Target::Unix(path) => match UnixStream::connect(path).await {
            Ok(c) => greet(c, &at, UnixStream::into_split).await,
            Err(e) => failed(e),
        },
        Target::Tcp { address, tls } => {
            let tcp = match connect_tcp(address).await {
                Ok(c) => c,
                Err(e) => return failed(e),
            };
            // No Nagle delay, and an agent that vanished is noticed as
            // HTTP/2 pings notice it on the gRPC link.
            if let Err(e) = fg::watch_tcp_peer(&tcp) {
                // Served without: a vanished agent is then noticed only by
                // a write, or by the GETs' deadlines.
                tracing::warn!(error = %e, "framed GETs: could not set TCP keepalive on a connection");
            }
            let Some((connector, name)) = tls else {
                return greet(tcp, &at, TcpStream::into_split).await;
            };
            let tls = match connector.connect(name.clone(), tcp).await {
                Ok(t) => t,
                Err(e) => return Opened::Failed(format!("{at}: TLS: {e}")),
            };
            match tls.get_ref().1.alpn_protocol() {
                Some(p) if p == fg::ALPN => greet(tls, &at, tokio::io::split).await,
                other => Opened::NotServed(format!(
                    "over TLS the agent chose {}",
                    other.map_or("no protocol".into(), |p| String::from_utf8_lossy(p).into_owned())
                )),
            }
        }
    }
}

/// Connects to the first of `address`'s addresses that answers, in the
/// resolver's order, giving each but the last [`PER_ADDRESS_WAIT`]: one
/// that drops packets does not hold every framed open until
/// [`OPEN_WAIT`].
async fn connect_tcp(address: &str) -> std::io::Result<TcpStream> {
    let addresses: Vec<_> = tokio::net::lookup_host(address).await?.collect();
    let mut last = None;
    for (i, a) in addresses.iter().enumerate() {
        // The last address gets what is left of the open's wait (a lost
        // SYN is sent again after a second).
        let wait = if i + 1 < addresses.len() { PER_ADDRESS_WAIT } else { OPEN_WAIT };
        match tokio::time::timeout(wait, TcpStream::connect(a)).await {
            Ok(Ok(c)) => return Ok(c),
            Ok(Err(e)) => last = Some(e),
            Err(_) => {
                let why = format!("{a}: no answer in {wait:?}");
                last = Some(std::io::Error::new(std::io::ErrorKind::TimedOut, why));
            }
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "the name has no address")))
}

/// Says the preface on `conn` and reads the agent's answer; framed, its
/// halves by `split`.
async fn greet<C, R, W>(mut conn: C, at: &str, split: impl FnOnce(C) -> (R, W)) -> Opened
where
    C: AsyncRead + AsyncWrite + Unpin,
    R: AsyncRead + Send + Unpin + 'static,
    W: AsyncWrite + Send + Unpin + 'static,
{
    // Flushed: over TLS what the socket cannot take at once stays in the
    // session's buffer until then.
    if let Err(e) = async {
        conn.write_all(fg::PREFACE).await?;
        conn.flush().await
    }
    .await
    {
        return Opened::Failed(format!("{at}: {e}"));
    }
    let mut answer = [0u8; fg::PREFACE.len()];
    let mut got = 0;
    while got < answer.len() {
        match conn.read(&mut answer[got..]).await {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(_) if got > 0 => break,
            Err(e) => return Opened::Failed(format!("{at}: {e}")),
        }
        if answer[..got] != fg::PREFACE[..got] {
            return Opened::NotServed("the agent answered something else".into());
        }
    }
    // Every byte that came matched: a whole answer, or one cut short (an
    // agent stopping), which says nothing against framing.
    if got == answer.len() {
        let (rd, wr) = split(conn);
        Opened::Framed(Halves { rd: Box::new(rd), wr: Box::new(wr) })
    } else {
        Opened::Failed(format!("the agent closed the connection after {got} bytes of its answer"))
    }
}

/// Sends each message of `body` on `conn` and returns the agent's answers,
/// ending with the stream's status if the agent ended it with one. When
/// `body` ends (the stream was given up), our side of the connection
/// closes and the agent stops the GETs still running. A write that fails
/// calls `failed` and ends the answers too (the stream is over; an agent
/// that takes no GETs may not close either). `sent` counts the GETs
/// written.
pub fn exchange<B, F>(
    conn: Halves,
    body: B,
    sent: prometheus::IntCounter,
    failed: F,
) -> impl Stream<Item = Result<apb::GetManyItem, tonic::Status>>
where
    B: Stream<Item = apb::GetStreamRequest> + Send + 'static,
    F: FnOnce(tonic::Status) + Send + 'static,
{
    let Halves { rd, mut wr } = conn;
    let (write_failed, stop_reading) = tokio::sync::oneshot::channel::<tonic::Status>();
    tokio::spawn(async move {
        let mut body = std::pin::pin!(body);
        let mut out = Vec::new();
        while let Some(m) = body.next().await {
            out.clear();
            fg::push_gets(&mut out, &m);
            let why = match tokio::time::timeout(WRITE_WAIT, async {
                wr.write_all(&out).await?;
                wr.flush().await
            })
            .await
            {
                Ok(Ok(())) => {
                    sent.inc_by(m.gets.len() as u64);
                    // A large message's room is not kept for the link's life.
                    out.shrink_to(64 << 10);
                    continue;
                }
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "framed GETs: writing to the agent failed");
                    tonic::Status::unavailable(format!("framed GETs to the agent: {e}"))
                }
                Err(_) => {
                    tracing::warn!("framed GETs: the agent took no GETs for {WRITE_WAIT:?}; closing");
                    tonic::Status::unavailable(format!("the agent took no GETs for {WRITE_WAIT:?}"))
                }
            };
            failed(why.clone());
            let _ = write_failed.send(why);
            break;
        }
        // Dropping the write half closes our side: the agent stops what
        // runs and closes, which ends the answers below.
    });
    futures::stream::unfold(Some((FrameReader::new(rd), Some(stop_reading))), |state| async move {
        let (mut r, mut stop) = state?;
        let next = match stop.as_mut() {
            Some(stop_reading) => tokio::select! {
                biased;
                why = stop_reading => match why {
                    Ok(status) => return Some((Err(status), None)),
                    // The writer ended because the stream was given up: the
                    // answers still come until the agent closes.
                    Err(_) => {
                        stop = None;
                        r.next().await
                    }
                },
                f = r.next() => f,
            },
            None => r.next().await,
        };
        match next {
            Ok(Some(Frame::Answer(item))) => Some((Ok(item), Some((r, stop)))),
            Ok(Some(Frame::End { code, message })) => Some((Err(tonic::Status::new(code.into(), message)), None)),
            Ok(Some(Frame::Gets(_))) => Some((Err(tonic::Status::internal("the agent sent a shim's frame")), None)),
            Ok(None) => None,
            Err(e) => Some((Err(tonic::Status::unavailable(format!("framed GETs from the agent: {e}"))), None)),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::AgentTls;
    use crate::get_stream::GetStreams;
    use crate::test_agent::{serve, Fake};
    use sluice_proto::common::TransferReport;
    use std::path::PathBuf;
    use std::sync::atomic::Ordering::SeqCst;

    /// A framed agent on `path`: answers each GET with its request id;
    /// with `end_after`, ends each connection with RESOURCE_EXHAUSTED at
    /// that many GETs.
    fn framed_agent(path: PathBuf, end_after: Option<usize>) {
        let l = tokio::net::UnixListener::bind(&path).unwrap();
        tokio::spawn(async move {
            while let Ok((mut c, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut preface = [0u8; fg::PREFACE.len()];
                    c.read_exact(&mut preface).await.unwrap();
                    assert_eq!(&preface, fg::PREFACE);
                    c.write_all(fg::PREFACE).await.unwrap();
                    let (rd, mut wr) = c.into_split();
                    let (mut r, mut seen) = (FrameReader::new(rd), 0);
                    while let Ok(Some(Frame::Gets(m))) = r.next().await {
                        let mut out = Vec::new();
                        for g in m.gets {
                            seen += 1;
                            if end_after == Some(seen) {
                                fg::push_end(&mut out, tonic::Code::ResourceExhausted as i32, "enough");
                                let _ = wr.write_all(&out).await;
                                return;
                            }
                            let request_id = g.item.unwrap().request_id;
                            let report = Some(TransferReport { request_id, ..Default::default() });
                            let ok = apb::get_many_item::Result::Ok(apb::GetReply { report, ..Default::default() });
                            fg::push_answer(&mut out, &apb::GetManyItem { index: g.index, result: Some(ok) });
                        }
                        wr.write_all(&out).await.unwrap();
                    }
                });
            }
        });
    }

    fn get(n: usize) -> apb::GetRequest {
        apb::GetRequest { session_id: "s".into(), request_id: format!("r{n}"), ..Default::default() }
    }

    fn request_id(a: &Result<apb::GetReply, tonic::Status>) -> Option<String> {
        a.as_ref().ok().and_then(|r| r.report.as_ref()).map(|r| r.request_id.clone())
    }

    fn counter() -> prometheus::IntCounter {
        prometheus::IntCounter::new("t", "t").unwrap()
    }

    fn framed_to(socket: PathBuf) -> crate::get_stream::FramedTo {
        crate::get_stream::FramedTo { target: Arc::new(Target::Unix(socket)), links: counter(), gets: counter() }
    }

    #[tokio::test]
    async fn gets_go_framed_to_an_agent_that_serves_it_each_with_its_own_answer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.sock");
        framed_agent(path.clone(), None);
        let fake = Fake::default();
        let agent = serve(fake.clone()).await;
        let streams = GetStreams::new(vec![agent.clone(), agent.clone()], counter(), Some(framed_to(path)));
        let calls = (0..40).map(|n| {
            let (streams, agent) = (streams.clone(), agent.clone());
            async move { (n, streams.get(agent, get(n)).await) }
        });
        let answers = tokio::time::timeout(Duration::from_secs(10), futures::future::join_all(calls)).await;
        for (n, a) in answers.expect("every GET answered") {
            assert_eq!(request_id(&a).as_deref(), Some(format!("r{n}").as_str()), "GET {n}: {a:?}");
        }
        assert_eq!(streams.framed_opened(), 2, "one framed connection per agent connection");
        assert_eq!((fake.streams_opened.load(SeqCst), fake.unary.load(SeqCst)), (0, 0), "nothing over gRPC");
    }

    #[tokio::test]
    async fn an_agent_that_ends_a_framed_stream_fails_its_gets_with_its_status_and_the_next_opens_another() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.sock");
        framed_agent(path.clone(), Some(2));
        let agent = serve(Fake::default()).await;
        let streams = GetStreams::new(vec![agent.clone()], counter(), Some(framed_to(path)));
        assert_eq!(request_id(&streams.get(agent.clone(), get(0)).await).as_deref(), Some("r0"));
        let ended = streams.get(agent.clone(), get(1)).await.unwrap_err();
        assert_eq!((ended.code(), ended.message()), (tonic::Code::ResourceExhausted, "enough"));
        assert_eq!(request_id(&streams.get(agent.clone(), get(2)).await).as_deref(), Some("r2"));
        assert_eq!(streams.framed_opened(), 2);
    }

    #[tokio::test]
    async fn an_agent_that_does_not_serve_framed_gets_gets_calls_from_then_on() {
        // A gRPC-only server on the socket: it closes a connection that
        // does not start with HTTP/2's preface.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.sock");
        let l = tokio::net::UnixListener::bind(&path).unwrap();
        let incoming = futures::stream::unfold(l, |l| async move { Some((l.accept().await.map(|(s, _)| s), l)) });
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(apb::agent_server::AgentServer::new(Fake::default()))
                .serve_with_incoming(incoming),
        );
        let fake = Fake::default();
        let agent = serve(fake.clone()).await;
        let streams = GetStreams::new(vec![agent.clone()], counter(), Some(framed_to(path)));
        for n in 0..3 {
            let a = tokio::time::timeout(Duration::from_secs(10), streams.get(agent.clone(), get(n))).await.unwrap();
            assert_eq!(request_id(&a).as_deref(), Some(format!("r{n}").as_str()));
        }
        assert_eq!(streams.framed_opened(), 0);
        assert_eq!(fake.streams_opened.load(SeqCst), 1, "a GetStream call instead");
        assert!(streams.framed_off(), "and from then on");
    }

    #[tokio::test]
    async fn an_agent_that_closes_unanswered_leaves_that_stream_to_a_call_and_framing_on() {
        // Accepts and closes at once, as an agent stopping may.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.sock");
        let l = tokio::net::UnixListener::bind(&path).unwrap();
        tokio::spawn(async move {
            while let Ok((c, _)) = l.accept().await {
                drop(c)
            }
        });
        let fake = Fake::default();
        let agent = serve(fake.clone()).await;
        let streams = GetStreams::new(vec![agent.clone()], counter(), Some(framed_to(path)));
        let a = tokio::time::timeout(Duration::from_secs(5), streams.get(agent.clone(), get(0))).await.unwrap();
        assert_eq!(request_id(&a).as_deref(), Some("r0"));
        assert_eq!((streams.framed_opened(), fake.streams_opened.load(SeqCst)), (0, 1), "a GetStream call");
        assert!(!streams.framed_off(), "no answer is not a refusal");
    }

    #[tokio::test]
    async fn a_framed_connection_that_cannot_be_made_leaves_that_stream_to_a_call() {
        let dir = tempfile::tempdir().unwrap();
        let fake = Fake::default();
        let agent = serve(fake.clone()).await;
        let streams = GetStreams::new(vec![agent.clone()], counter(), Some(framed_to(dir.path().join("none.sock"))));
        for n in 0..3 {
            let a = tokio::time::timeout(Duration::from_secs(5), streams.get(agent.clone(), get(n))).await.unwrap();
            assert_eq!(request_id(&a).as_deref(), Some(format!("r{n}").as_str()));
        }
        assert_eq!((streams.framed_opened(), fake.streams_opened.load(SeqCst)), (0, 1), "a GetStream call");
        assert!(!streams.framed_off(), "a socket that is not there says nothing of the agent: tried again later");
    }

    /// A TLS "agent" on the loopback choosing among `alpn`: one that
    /// chose framed GETs answers the preface and each GET; `tls` is the
    /// shim's `[agent.tls]` for it (files in `dir`).
    async fn tls_agent(dir: &std::path::Path, alpn: &[&[u8]]) -> (String, AgentTls) {
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let ca = rcgen::Issuer::new(ca_params, ca_key);
        let (agent_key, shim_key) = (rcgen::KeyPair::generate().unwrap(), rcgen::KeyPair::generate().unwrap());
        let agent = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap().signed_by(&agent_key, &ca);
        let shim = rcgen::CertificateParams::new(vec!["alpha".to_owned()]).unwrap().signed_by(&shim_key, &ca);
        let file = |name: &str, pem: String| {
            std::fs::write(dir.join(name), pem).unwrap();
            dir.join(name)
        };
        let tls = AgentTls {
            ca: file("ca.crt", ca_cert.pem()),
            cert: file("shim.crt", shim.unwrap().pem()),
            key: file("shim.key", shim_key.serialize_pem()),
            server_name: Some("localhost".into()),
        };
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca_cert.der().clone()).unwrap();
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .unwrap();
        let mut config =
            rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_client_cert_verifier(verifier)
                .with_single_cert(
                    vec![agent.unwrap().der().clone()],
                    rustls::pki_types::PrivateKeyDer::try_from(agent_key.serialize_der()).unwrap(),
                )
                .unwrap();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((c, _)) = l.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut c) = acceptor.accept(c).await else { return };
                    if c.get_ref().1.alpn_protocol() != Some(fg::ALPN) {
                        return;
                    }
                    let mut preface = [0u8; fg::PREFACE.len()];
                    c.read_exact(&mut preface).await.unwrap();
                    assert_eq!(&preface, fg::PREFACE);
                    c.write_all(fg::PREFACE).await.unwrap();
                    let (rd, mut wr) = tokio::io::split(c);
                    let mut r = FrameReader::new(rd);
                    while let Ok(Some(Frame::Gets(m))) = r.next().await {
                        let mut out = Vec::new();
                        for g in m.gets {
                            let request_id = g.item.unwrap().request_id;
                            let report = Some(TransferReport { request_id, ..Default::default() });
                            let ok = apb::get_many_item::Result::Ok(apb::GetReply { report, ..Default::default() });
                            fg::push_answer(&mut out, &apb::GetManyItem { index: g.index, result: Some(ok) });
                        }
                        wr.write_all(&out).await.unwrap();
                    }
                });
            }
        });
        (format!("https://127.0.0.1:{}", addr.port()), tls)
    }

    fn tcp_target(uri: &str, tls: Option<&AgentTls>) -> Target {
        Target::tcp(&uri.parse().unwrap(), tls.map(|t| t.read().unwrap()).as_ref()).unwrap()
    }

    #[tokio::test]
    async fn gets_go_framed_over_the_links_tls_to_an_agent_that_chooses_them() {
        let dir = tempfile::tempdir().unwrap();
        let (uri, tls) = tls_agent(dir.path(), &[fg::ALPN, b"h2"]).await;
        let fake = Fake::default();
        let agent = serve(fake.clone()).await;
        let to = crate::get_stream::FramedTo {
            target: Arc::new(tcp_target(&uri, Some(&tls))),
            links: counter(),
            gets: counter(),
        };
        let streams = GetStreams::new(vec![agent.clone()], counter(), Some(to));
        for n in 0..5 {
            let a = tokio::time::timeout(Duration::from_secs(10), streams.get(agent.clone(), get(n))).await.unwrap();
            assert_eq!(request_id(&a).as_deref(), Some(format!("r{n}").as_str()));
        }
        assert_eq!(streams.framed_opened(), 1);
        assert_eq!((fake.streams_opened.load(SeqCst), fake.unary.load(SeqCst)), (0, 0), "nothing over gRPC");
    }

    #[tokio::test]
    async fn an_agent_that_chooses_h2_over_tls_does_not_serve_framed_gets() {
        let dir = tempfile::tempdir().unwrap();
        let (uri, tls) = tls_agent(dir.path(), &[b"h2"]).await;
        match open(&tcp_target(&uri, Some(&tls))).await {
            Opened::NotServed(why) => assert!(why.contains("chose h2"), "{why}"),
            Opened::Framed(_) => panic!("framed"),
            Opened::Failed(why) => panic!("failed: {why}"),
        }
    }

    #[test]
    fn a_tcp_links_target_is_its_host_and_port() {
        let addr = |t: Target| match t {
            Target::Tcp { address, .. } => address,
            Target::Unix(p) => panic!("{p:?}"),
        };
        assert_eq!(addr(tcp_target("http://10.0.0.2:50051", None)), "10.0.0.2:50051");
        assert_eq!(addr(tcp_target("http://[fd00::2]:7", None)), "[fd00::2]:7");
        assert_eq!(addr(tcp_target("http://dpu.example", None)), "dpu.example:80");
        assert_eq!(addr(tcp_target("https://dpu.example", None)), "dpu.example:443");
    }

    #[tokio::test]
    async fn tls_files_that_could_verify_no_agent_stop_the_start_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let (uri, tls) = tls_agent(dir.path(), &[fg::ALPN, b"h2"]).await;
        let cfg: crate::config::AgentLink = toml::from_str(&format!("grpc = {uri:?}")).unwrap();
        let start = |tls: AgentTls, framed_gets: bool| {
            crate::agent_link::AgentLink::new(&crate::config::AgentLink { tls: Some(tls), framed_gets, ..cfg.clone() })
        };
        // The files as issued: the shim starts, framed GETs set up.
        assert!(start(tls.clone(), true).expect("starts").framed_target().is_some());
        assert!(start(tls.clone(), false).expect("starts").framed_target().is_none());
        // tonic would take each of these and fail every handshake later.
        let garbage = dir.path().join("garbage.pem");
        std::fs::write(&garbage, "not a certificate\n").unwrap();
        for framed_gets in [true, false] {
            let e = start(AgentTls { ca: garbage.clone(), ..tls.clone() }, framed_gets).err().expect("refused");
            assert!(e.to_string().contains("no usable CA certificate") && e.to_string().contains("garbage.pem"), "{e}");
            let e = start(AgentTls { cert: garbage.clone(), ..tls.clone() }, framed_gets).err().expect("refused");
            assert!(e.to_string().contains("garbage.pem"), "{e}");
            let e = start(AgentTls { key: dir.path().join("missing.key"), ..tls.clone() }, framed_gets).err().unwrap();
            assert!(e.to_string().contains("missing.key"), "{e}");
        }
    }
}
