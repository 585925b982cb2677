//! One connection to the agent's gRPC listener cannot open calls without
//! end: a `GetStream` is accepted before any session is named (each GET on
//! it is checked), and each open call is a task on the agent. Past the
//! agent's bound (`MAX_CALLS_PER_CONNECTION` in dpu-agent/src/listeners.rs,
//! announced in HTTP/2's SETTINGS) a client waits for a call to end; the
//! agent never holds more.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use std::time::Duration;

use futures::channel::mpsc;
use sluice_proto::agent as apb;
use sluice_proto::agent::agent_client::AgentClient;
use sluice_tests::Stack;

/// The agent's `MAX_CALLS_PER_CONNECTION`.
const MAX_CALLS: usize = 1024;

type Held = (mpsc::UnboundedSender<apb::GetStreamRequest>, tonic::Streaming<apb::GetManyItem>);

async fn open(grpc: &mut AgentClient<tonic::transport::Channel>) -> Held {
    let (tx, rx) = mpsc::unbounded();
    let answers = grpc.get_stream(rx).await.expect("the stream is taken").into_inner();
    (tx, answers)
}

#[tokio::test]
async fn one_connection_holds_at_most_the_agents_bound_of_calls() {
    let stack = Stack::start();
    // One channel is one HTTP/2 connection.
    let mut grpc = AgentClient::connect(format!("http://{}", stack.grpc_addr)).await.unwrap();
    let mut held = Vec::with_capacity(MAX_CALLS);
    for _ in 0..MAX_CALLS {
        held.push(open(&mut grpc).await);
    }
    // One more is not taken while all of those are open...
    let mut waiting = grpc.clone();
    let extra = tokio::spawn(async move { open(&mut waiting).await });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!extra.is_finished(), "the agent took a call past its bound on one connection");
    // ...and is taken as soon as one of them ends.
    drop(held.pop());
    let (_tx, _answers) = tokio::time::timeout(Duration::from_secs(20), extra)
        .await
        .expect("the waiting call is taken once another ends")
        .unwrap();
    // The connection still serves other calls in turn, and a second
    // connection has a bound of its own.
    drop(held.split_off(MAX_CALLS - 8));
    let epoch = tokio::time::timeout(Duration::from_secs(20), grpc.get_epoch(apb::GetEpochRequest {}))
        .await
        .expect("a unary call on the same connection once calls ended")
        .unwrap();
    assert!(!epoch.into_inner().epoch.is_empty());
    let mut other = AgentClient::connect(format!("http://{}", stack.grpc_addr)).await.unwrap();
    assert!(!other.get_epoch(apb::GetEpochRequest {}).await.unwrap().into_inner().epoch.is_empty());
}
