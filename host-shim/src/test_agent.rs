//! A fake agent for the shim's unit tests: scripted `GetMany` and
//! `GetStream` answers, every other call unimplemented.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use std::sync::{Arc, Mutex};

use sluice_proto::agent::{self as apb, agent_client::AgentClient};
use tonic::transport::Channel;

/// An agent whose `Get` answers at once and whose `GetMany` answers
/// as `script` says, after an optional pause; it counts the calls and
/// notes when a `GetMany` stream was dropped by the shim.
///
/// On a `GetStream` it answers each message's GETs (request id echoed) in
/// reverse order, unless `stream_hold`; after `stream_end_after` GETs it
/// ends the call with UNAVAILABLE. It notes the GETs and cancels it got.
#[derive(Clone, Default)]
pub struct Fake {
    pub script: Arc<Mutex<Vec<Result<apb::GetManyItem, tonic::Status>>>>,
    pub pause: Option<std::time::Duration>,
    pub unary: Arc<std::sync::atomic::AtomicUsize>,
    pub batches: Arc<Mutex<Vec<Vec<String>>>>,
    pub dropped: Arc<std::sync::atomic::AtomicBool>,
    pub stream_hold: bool,
    pub stream_end_after: Option<usize>,
    /// Every streamed GET answered UNSUPPORTED.
    pub stream_unsupported: bool,
    /// GetStream itself refused, UNIMPLEMENTED.
    pub stream_refused: bool,
    pub streams_opened: Arc<std::sync::atomic::AtomicUsize>,
    /// (index, session, request id) of every streamed GET.
    pub streamed: Arc<Mutex<Vec<(u32, String, String)>>>,
    pub cancels: Arc<Mutex<Vec<u32>>>,
}

struct NoteDrop(Arc<std::sync::atomic::AtomicBool>);
impl Drop for NoteDrop {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

pub fn ok_item(index: u32, request_id: &str) -> Result<apb::GetManyItem, tonic::Status> {
    let report = sluice_proto::common::TransferReport { request_id: request_id.into(), ..Default::default() };
    let reply = apb::GetReply { report: Some(report), object_size: u64::from(index), etag: String::new() };
    Ok(apb::GetManyItem { index, result: Some(apb::get_many_item::Result::Ok(reply)) })
}

type Items = std::pin::Pin<Box<dyn futures::Stream<Item = Result<apb::GetManyItem, tonic::Status>> + Send>>;
type Res<T> = Result<tonic::Response<T>, tonic::Status>;

#[tonic::async_trait]
impl sluice_proto::agent::agent_server::Agent for Fake {
    type GetManyStream = Items;
    type GetStreamStream = Items;
    async fn get_stream(&self, req: tonic::Request<tonic::Streaming<apb::GetStreamRequest>>) -> Res<Items> {
        self.streams_opened.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if self.stream_refused {
            return Err(tonic::Status::unimplemented("no GetStream here"));
        }
        let mut inbound = req.into_inner();
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let me = self.clone();
        tokio::spawn(async move {
            let mut seen = 0;
            while let Ok(Some(msg)) = inbound.message().await {
                me.cancels.lock().unwrap().extend(msg.cancel);
                let mut answers = Vec::new();
                let mut end = false;
                for g in msg.gets {
                    seen += 1;
                    let id = g.item.map(|i| i.request_id).unwrap_or_default();
                    me.streamed.lock().unwrap().push((g.index, g.session_id, id.clone()));
                    if me.stream_unsupported {
                        let d = sluice_proto::common::ErrorDetail {
                            code: sluice_proto::common::ErrorCode::Unsupported as i32,
                            message: "not here".into(),
                            needed_bytes: 0,
                        };
                        answers.push(Ok(apb::GetManyItem {
                            index: g.index,
                            result: Some(apb::get_many_item::Result::Error(d)),
                        }));
                    } else if !me.stream_hold {
                        answers.push(ok_item(g.index, &id));
                    }
                    if Some(seen) == me.stream_end_after {
                        end = true;
                        break;
                    }
                }
                for a in answers.into_iter().rev() {
                    let _ = tx.unbounded_send(a);
                }
                if end {
                    let _ = tx.unbounded_send(Err(tonic::Status::unavailable("the fake agent ended the stream")));
                    return;
                }
            }
        });
        Ok(tonic::Response::new(Box::pin(rx)))
    }
    async fn get_many(&self, req: tonic::Request<apb::GetManyRequest>) -> Res<Items> {
        self.batches.lock().unwrap().push(req.into_inner().items.into_iter().map(|i| i.request_id).collect());
        let (script, pause, note) = (self.script.lock().unwrap().clone(), self.pause, NoteDrop(self.dropped.clone()));
        let s = futures::StreamExt::then(futures::stream::iter(script), move |m| async move {
            if let Some(p) = pause {
                tokio::time::sleep(p).await;
            }
            m
        });
        let s = futures::StreamExt::map(s, move |m| {
            let _keep = &note;
            m
        });
        Ok(tonic::Response::new(Box::pin(s)))
    }
    async fn get(&self, req: tonic::Request<apb::GetRequest>) -> Res<apb::GetReply> {
        self.unary.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let id = req.into_inner().request_id;
        let report = sluice_proto::common::TransferReport { request_id: id, ..Default::default() };
        Ok(tonic::Response::new(apb::GetReply { report: Some(report), ..Default::default() }))
    }
    async fn get_epoch(&self, _: tonic::Request<apb::GetEpochRequest>) -> Res<apb::GetEpochReply> {
        Err(tonic::Status::unimplemented(""))
    }
    async fn open_session(&self, _: tonic::Request<apb::OpenSessionRequest>) -> Res<apb::OpenSessionReply> {
        Err(tonic::Status::unimplemented(""))
    }
    async fn close_session(&self, _: tonic::Request<apb::CloseSessionRequest>) -> Res<apb::CloseSessionReply> {
        Err(tonic::Status::unimplemented(""))
    }
    async fn register_region(&self, _: tonic::Request<apb::RegisterRegionRequest>) -> Res<apb::RegisterRegionReply> {
        Err(tonic::Status::unimplemented(""))
    }
    async fn release_region(&self, _: tonic::Request<apb::ReleaseRegionRequest>) -> Res<apb::ReleaseRegionReply> {
        Err(tonic::Status::unimplemented(""))
    }
    async fn put(&self, _: tonic::Request<apb::PutRequest>) -> Res<apb::PutReply> {
        Err(tonic::Status::unimplemented(""))
    }
    async fn head(&self, _: tonic::Request<apb::HeadRequest>) -> Res<apb::HeadReply> {
        Err(tonic::Status::unimplemented(""))
    }
    async fn list(&self, _: tonic::Request<apb::ListRequest>) -> Res<apb::ListReply> {
        Err(tonic::Status::unimplemented(""))
    }
    async fn delete(&self, _: tonic::Request<apb::DeleteRequest>) -> Res<apb::DeleteReply> {
        Err(tonic::Status::unimplemented(""))
    }
    async fn stats(&self, _: tonic::Request<apb::StatsRequest>) -> Res<apb::StatsReply> {
        Err(tonic::Status::unimplemented(""))
    }
    async fn renew(&self, _: tonic::Request<apb::RenewRequest>) -> Res<apb::RenewReply> {
        Err(tonic::Status::unimplemented(""))
    }
}

/// Serves `fake` on a loopback port; a client for it.
pub async fn serve(fake: Fake) -> AgentClient<Channel> {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let incoming = futures::stream::unfold(l, |l| async move {
        let c = l.accept().await.map(|(s, _)| s);
        Some((c, l))
    });
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(sluice_proto::agent::agent_server::AgentServer::new(fake))
            .serve_with_incoming(incoming),
    );
    AgentClient::connect(format!("http://{addr}")).await.unwrap()
}
