//! Framed GETs on the Unix listener: `GetStream` without HTTP/2 for a
//! co-located shim (`sluice_proto::framed_gets` has the wire format and
//! why).
//!
//! The listener tells the two protocols apart by a connection's first byte
//! ([`sort`]): HTTP/2's preface starts with `P`, the framed one with `S`.
//! A framed connection is served by the same driver as a `GetStream` call
//! (`get_stream.rs`), so every rule holds as it does there: each GET's
//! session is looked up against the Unix origin, its namespace authorised,
//! its deadline kept; GETs running and answers untaken are bounded; a peer
//! that breaks the rules gets the stream's status and loses it; on the
//! agent's stop new GETs are refused and the stream ends once those running
//! are answered (the listener waits for its framed connections as the gRPC
//! server waits for its calls). What this module adds is bounded the same
//! way:
//! * a connection that has not sent its whole preface (gRPC's first byte,
//!   or all of the framed one) within [`FIRST_BYTES_WAIT`] is closed, and
//!   at most [`SORTING`] connections are being sorted at once (accepting
//!   waits, as for TLS handshakes);
//! * a malformed or oversized frame, or the shim closing its side, closes
//!   the connection and stops its GETs (nobody is left to take their
//!   answers);
//! * a peer that stops reading its answers: the driver ends the stream
//!   past its bound of untaken answers, and a write that waits longer than
//!   [`WRITE_WAIT`] closes the connection.
//!
//! The sorting places are shared by every connection of the socket: a
//! local process that fills them with silent connections delays the
//! shim's too (by [`FIRST_BYTES_WAIT`] at a time), as the TLS listeners'
//! handshake places do. Only the shim's user and group reach the socket
//! (`socket_mode`).

use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use nix::sys::socket::{recv, MsgFlags};
use sluice_proto::framed_gets::{self as fg, Frame, FrameReader};
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, watch, Semaphore};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::task::TaskTracker;
use tonic::Status;

use crate::get_stream::{Answer, RunGet};

/// Longest a new connection may take to send its preface (a shim sends
/// its HTTP/2 or framed preface at once).
pub const FIRST_BYTES_WAIT: Duration = Duration::from_secs(3);
/// Most connections waiting for their preface at once.
pub const SORTING: usize = 256;
/// Longest one write of answers may wait for the peer to take them.
pub const WRITE_WAIT: Duration = Duration::from_secs(30);
/// Most bytes of answers gathered into one write.
const WRITE_BATCH: usize = 256 << 10;

/// The gRPC connections of `conns`, and the tasks of the framed ones: each
/// framed connection is served by `framed` in a task of `tasks` (on the
/// runtime this is called on); the rest are passed on, in the order their
/// first bytes came. Once the gRPC server is done, wait for `tasks`.
pub fn sort<S, F, Fut>(conns: S, framed: F) -> (ReceiverStream<std::io::Result<UnixStream>>, TaskTracker)
where
    S: Stream<Item = std::io::Result<UnixStream>> + Send + 'static,
    F: Fn(UnixStream) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    sort_within(conns, framed, FIRST_BYTES_WAIT, SORTING)
}

/// [`sort`], with at most `places` connections given `wait` each.
fn sort_within<S, F, Fut>(
    conns: S,
    framed: F,
    wait: Duration,
    places: usize,
) -> (ReceiverStream<std::io::Result<UnixStream>>, TaskTracker)
where
    S: Stream<Item = std::io::Result<UnixStream>> + Send + 'static,
    F: Fn(UnixStream) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (grpc, out) = mpsc::channel(64);
    let tasks = TaskTracker::new();
    let sorting = tasks.clone();
    tokio::spawn(async move {
        let slots = Arc::new(Semaphore::new(places));
        let mut conns = std::pin::pin!(conns);
        loop {
            let slot = tokio::select! {
                s = slots.clone().acquire_owned() => s,
                () = grpc.closed() => break,
            };
            let Ok(slot) = slot else { break };
            let Some(conn) = crate::accept::next_conn(&mut conns, grpc.closed(), "a Unix connection").await else {
                break;
            };
            let (grpc, framed) = (grpc.clone(), framed.clone());
            sorting.spawn(async move {
                let sorted = tokio::time::timeout(wait, preface(conn)).await;
                // The place is held until the whole preface has come.
                drop(slot);
                match sorted {
                    Ok(Ok(Sorted::Framed(conn))) => framed(conn).await,
                    Ok(Ok(Sorted::Grpc(conn))) => {
                        let _ = grpc.send(Ok(conn)).await;
                    }
                    Ok(Ok(Sorted::Closed)) => {}
                    Ok(Err(why)) => tracing::debug!(%why, "a Unix connection closed before it was served"),
                    Err(_) => tracing::debug!("a Unix connection sent no whole preface in {wait:?}; closed"),
                }
            });
        }
        // Nothing more to sort: the tracker may finish once its tasks have.
        sorting.close();
    });
    (ReceiverStream::new(out), tasks)
}

/// What a connection's first bytes said.
enum Sorted {
    /// It sent the framed preface (read): serve it framed.
    Framed(UnixStream),
    /// Anything else (nothing read): the gRPC server's.
    Grpc(UnixStream),
    /// It closed before sending a byte.
    Closed,
}

/// Sorts `conn` by its first byte; a framed one's preface is read whole.
async fn preface(mut conn: UnixStream) -> Result<Sorted, String> {
    match first_byte(&conn).await.map_err(|e| e.to_string())? {
        None => Ok(Sorted::Closed),
        Some(b) if b != fg::PREFACE[0] => Ok(Sorted::Grpc(conn)),
        Some(_) => {
            let mut preface = [0u8; fg::PREFACE.len()];
            conn.read_exact(&mut preface).await.map_err(|e| format!("reading the framed preface: {e}"))?;
            if &preface == fg::PREFACE {
                Ok(Sorted::Framed(conn))
            } else {
                Err("not the framed-GETs preface".into())
            }
        }
    }
}

/// The first byte the peer sent, left unread; `None` if it closed first.
async fn first_byte(conn: &UnixStream) -> std::io::Result<Option<u8>> {
    let mut b = [0u8; 1];
    loop {
        conn.readable().await?;
        let peeked = conn.try_io(Interest::READABLE, || {
            recv(conn.as_raw_fd(), &mut b, MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT).map_err(std::io::Error::from)
        });
        match peeked {
            Ok(0) => return Ok(None),
            Ok(_) => return Ok(Some(b[0])),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Serves one framed connection whose preface [`sort`] has read, until
/// either side ends it.
pub async fn serve(conn: UnixStream, run: RunGet, stop: Option<watch::Receiver<bool>>) {
    match serve_conn(conn, run, stop).await {
        Ok(()) => tracing::debug!("framed GET connection ended"),
        Err(why) => tracing::debug!(%why, "framed GET connection closed"),
    }
}

async fn serve_conn(conn: UnixStream, run: RunGet, stop: Option<watch::Receiver<bool>>) -> Result<(), String> {
    let (rd, mut wr) = conn.into_split();
    written(wr.write_all(fg::PREFACE)).await?;
    let inbound = futures::stream::unfold(Some(FrameReader::new(rd)), |reader| async move {
        let mut r = reader?;
        // Whatever ends the shim's side ends the stream, and the driver
        // stops its GETs: a shim never half-closes a stream it still reads
        // (its side ends when it gives the stream up), so nobody would take
        // their answers. (A `GetStream` call's shim going away drops the
        // call, the same.)
        let gone = |why: String| Some((Err(Status::cancelled(why)), None));
        match r.next().await {
            Ok(Some(Frame::Gets(m))) => Some((Ok(m), Some(r))),
            Ok(None) => gone("the shim closed the connection".into()),
            Ok(Some(_)) => {
                tracing::warn!("framed GETs: a shim sent an agent's frame; closing its connection");
                gone("a shim sent an agent's frame".into())
            }
            // The shim went away mid-frame, or its socket failed.
            Err(e @ (fg::FramedError::Io(_) | fg::FramedError::Truncated)) => gone(e.to_string()),
            Err(e) => {
                tracing::warn!(error = %e, "framed GETs: a bad frame from a shim; closing its connection");
                gone(e.to_string())
            }
        }
    });
    let mut answers = crate::get_stream::start(run, Box::pin(inbound), stop).into_inner();
    let mut out = Vec::new();
    while let Some(a) = answers.recv().await {
        out.clear();
        // Whatever else is ready goes in the same write.
        let mut ended = push(&mut out, a);
        while !ended && out.len() < WRITE_BATCH {
            match answers.try_recv() {
                Ok(a) => ended = push(&mut out, a),
                Err(_) => break,
            }
        }
        written(wr.write_all(&out)).await?;
        if ended {
            break;
        }
        // A burst's room is not kept for the connection's life.
        out.shrink_to(WRITE_BATCH);
    }
    // Dropping `answers` (a write failed) stops the GETs still running.
    written(wr.shutdown()).await
}

/// Appends `a`; `true` when it ends the stream.
fn push(out: &mut Vec<u8>, a: Answer) -> bool {
    match a {
        Ok(item) => {
            fg::push_answer(out, &item);
            false
        }
        Err(status) => {
            fg::push_end(out, status.code() as i32, status.message());
            true
        }
    }
}

async fn written(w: impl std::future::Future<Output = std::io::Result<()>>) -> Result<(), String> {
    match tokio::time::timeout(WRITE_WAIT, w).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("writing answers: {e}")),
        Err(_) => Err(format!("the shim took no answers for {WRITE_WAIT:?}")),
    }
}

#[cfg(test)]
#[path = "framed_gets_tests.rs"]
mod tests;
