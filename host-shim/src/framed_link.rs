//! The shim's side of framed GETs (`sluice_proto::framed_gets`): a GET
//! stream to a co-located agent on a Unix connection of its own, without
//! HTTP/2. `get_stream.rs` decides when to use it and answers the GETs;
//! this opens the connection and turns it into the same two halves a
//! `GetStream` call has: messages out, answers (then why it ended) in.

use std::path::Path;
use std::time::Duration;

use futures::{Stream, StreamExt};
use sluice_proto::agent as apb;
use sluice_proto::framed_gets::{self as fg, Frame, FrameReader};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

/// Longest connecting and the agent's answer to the preface may take.
const OPEN_WAIT: Duration = Duration::from_secs(5);
/// Longest one write of GETs may wait for the agent to take them; past
/// it the connection is given up (its GETs fail, the next opens another).
const WRITE_WAIT: Duration = Duration::from_secs(30);

/// What opening a framed connection came to.
pub enum Opened {
    Framed(UnixStream),
    /// The agent answered, but not with the preface: it does not serve
    /// framed GETs (an older agent's HTTP/2 server sends its settings, then
    /// closes the connection).
    NotServed(String),
    /// No answer, or one cut short with every byte of it right (no agent, a
    /// full backlog, an agent stopping): this stream goes as a call, and the
    /// next tries framing again.
    Failed(String),
}

/// Connects to the agent's Unix socket at `path` and says the preface.
pub async fn open(path: &Path) -> Opened {
    match tokio::time::timeout(OPEN_WAIT, open_now(path)).await {
        Ok(o) => o,
        Err(_) => Opened::Failed(format!("no answer to the framed preface in {OPEN_WAIT:?}")),
    }
}

async fn open_now(path: &Path) -> Opened {
    let mut conn = match UnixStream::connect(path).await {
        Ok(c) => c,
        Err(e) => return Opened::Failed(format!("agent socket {}: {e}", path.display())),
    };
    if let Err(e) = conn.write_all(fg::PREFACE).await {
        return Opened::Failed(format!("agent socket {}: {e}", path.display()));
    }
    let mut answer = [0u8; fg::PREFACE.len()];
    let mut got = 0;
    while got < answer.len() {
        match conn.read(&mut answer[got..]).await {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(_) if got > 0 => break,
            Err(e) => return Opened::Failed(format!("agent socket {}: {e}", path.display())),
        }
        if answer[..got] != fg::PREFACE[..got] {
            return Opened::NotServed("the agent answered something else".into());
        }
    }
    // Every byte that came matched: a whole answer, or one cut short (an
    // agent stopping), which says nothing against framing.
    if got == answer.len() {
        Opened::Framed(conn)
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
    conn: UnixStream,
    body: B,
    sent: prometheus::IntCounter,
    failed: F,
) -> impl Stream<Item = Result<apb::GetManyItem, tonic::Status>>
where
    B: Stream<Item = apb::GetStreamRequest> + Send + 'static,
    F: FnOnce(tonic::Status) + Send + 'static,
{
    let (rd, mut wr) = conn.into_split();
    let (write_failed, stop_reading) = tokio::sync::oneshot::channel::<tonic::Status>();
    tokio::spawn(async move {
        let mut body = std::pin::pin!(body);
        let mut out = Vec::new();
        while let Some(m) = body.next().await {
            out.clear();
            fg::push_gets(&mut out, &m);
            let why = match tokio::time::timeout(WRITE_WAIT, wr.write_all(&out)).await {
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
        crate::get_stream::FramedTo { socket, links: counter(), gets: counter() }
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
}
