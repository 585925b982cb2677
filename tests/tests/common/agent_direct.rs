//! Talking to the agent straight over gRPC, as a shim does: sessions
//! opened with a tenant's proof, regions registered through the memory
//! socket. Shared by the test files that play a hostile shim.
#![allow(dead_code)] // each test file uses its own share of these

use sluice_client::Code;
use sluice_proto::agent as apb;
use sluice_proto::agent::agent_client::AgentClient;
use sluice_proto::auth;
use sluice_tests::Stack;

/// The agent's typed code from a gRPC status.
pub fn sluice_agent_code(st: &tonic::Status) -> Code {
    use sluice_proto::Message;
    let d = sluice_proto::common::ErrorDetail::decode(st.details()).expect("typed detail");
    Code::try_from(d.code).expect("known code")
}

/// The agent's current epoch, as a shim asks for it before signing.
pub async fn agent_epoch(grpc: &mut AgentClient<tonic::transport::Channel>) -> Vec<u8> {
    grpc.get_epoch(apb::GetEpochRequest {}).await.expect("GetEpoch needs no session").into_inner().epoch
}

/// An OpenSession request for `tenant` as `shim_id`, at `epoch` and time
/// `ts`, proven with `secret`, under a fresh nonce.
pub fn session_request(secret: &[u8], tenant: &str, shim_id: &str, epoch: &[u8], ts: u64) -> apb::OpenSessionRequest {
    let nonce = auth::new_nonce();
    let claim = auth::SessionClaim { tenant, shim_id, epoch, timestamp_ms: ts, nonce: &nonce };
    apb::OpenSessionRequest {
        tenant: tenant.into(),
        shim_id: shim_id.into(),
        timestamp_ms: ts,
        nonce: nonce.to_vec(),
        proof: auth::session_proof(secret, &claim),
        epoch: epoch.to_vec(),
        ..Default::default()
    }
}

pub async fn open_session(
    grpc: &mut AgentClient<tonic::transport::Channel>,
    stack: &Stack,
    tenant: &str,
    shim_id: &str,
) -> Result<String, tonic::Status> {
    let secret = auth::read_secret_file(&stack.dir.path().join(format!("{tenant}.shim-secret"))).unwrap();
    let epoch = agent_epoch(grpc).await;
    let req = session_request(&secret, tenant, shim_id, &epoch, auth::now_ms());
    grpc.open_session(req).await.map(|r| r.into_inner().session_id)
}

/// Registers `data` as a region in `session` the way a co-located shim
/// does (a sealed memfd over the agent's memory socket, then the ticket);
/// returns the agent's region id and the memory.
pub async fn agent_region(
    stack: &Stack,
    grpc: &mut AgentClient<tonic::transport::Channel>,
    session: &str,
    data: &[u8],
) -> (String, sluice_shm::MappedRegion) {
    use std::os::fd::AsFd;
    use tokio::io::AsyncBufReadExt;
    let memory = sluice_shm::MappedRegion::create("attack", data.len() as u64).unwrap();
    memory.write_at(0, data).unwrap();
    let sock = tokio::net::UnixStream::connect(stack.dir.path().join("mem.sock")).await.unwrap();
    sluice_shm::send_with_fds(&sock, b"R", &[memory.fd().as_fd()]).await.unwrap();
    let mut line = String::new();
    tokio::io::BufReader::new(sock).read_line(&mut line).await.unwrap();
    let ticket = line.trim().strip_prefix("OK ").unwrap_or_else(|| panic!("{line}")).to_owned();
    let req = apb::RegisterRegionRequest {
        session_id: session.into(),
        length: data.len() as u64,
        export: Some(apb::register_region_request::Export::ColocatedTicket(ticket)),
    };
    (grpc.register_region(req).await.unwrap().into_inner().region_id, memory)
}
