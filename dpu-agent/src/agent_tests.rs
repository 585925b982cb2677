//! An [`Agent`] assembled from parts (`Agent::from_parts`) with its
//! namespace on any S3 client: the session and request path — a session
//! opened with a proof, scoped to its origin, typed requests — run against
//! the in-memory store and against a real gateway alike.

use std::sync::Arc;

use sluice_proto::auth::{self, SessionClaim};

use crate::agent::{Agent, AgentParts};
use crate::config::AgentConfig;
use crate::error::AgentError;
use crate::hostmem::colocated::ColocatedMemory;
use crate::identity::{SessionRequest, ShimOrigin};
use crate::metrics::Metrics;
use crate::requests::{DeleteObject, HeadObject, ListObjects, RequestCtx};
use crate::s3::stores_tests::{on_every_store, Backend};
use crate::transports::RunningTransports;

const SECRET: &str = "agent-tests-shim-secret-0123456789abcdef";

/// An agent with tenant `alpha` whose namespace `d` is on `b`.
async fn agent_on(b: &Backend, dir: &std::path::Path) -> Agent {
    use std::os::unix::fs::PermissionsExt;
    let secret = dir.join("alpha.secret");
    std::fs::write(&secret, SECRET).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let ns = b.namespace();
    let endpoints: Vec<String> = ns.endpoints.iter().map(|e| format!("{e:?}")).collect();
    let cfg: AgentConfig = toml::from_str(&format!(
        "grpc_socket = \"{d}/agent.sock\"\nmemory_socket = \"{d}/mem.sock\"\nstate_dir = \"{d}\"\n\
         [credentials.c]\naccess_key = \"unused\"\nsecret_key = \"unused\"\n\
         [[tenants]]\nname = \"alpha\"\nshim_secret_file = {secret:?}\n\
         [[tenants.namespaces]]\nname = \"d\"\nendpoints = [{}]\nbucket = {:?}\ncredentials = \"c\"\nprefix = \"t/\"\n",
        endpoints.join(", "),
        ns.bucket,
        d = dir.display(),
    ))
    .unwrap();
    cfg.validate().unwrap();
    let metrics = Arc::new(Metrics::new().unwrap());
    let transports = RunningTransports::start(&cfg, &metrics).await.unwrap();
    let parts = AgentParts { memory: ColocatedMemory::new(), metrics, transports: &transports };
    Agent::from_parts(&cfg, parts, &|_, _| b.client()).unwrap()
}

/// Opens a session of `alpha` from the agent's Unix socket.
fn open(agent: &Agent) -> String {
    let nonce = auth::new_nonce();
    let claim = SessionClaim {
        tenant: "alpha",
        shim_id: "test-shim",
        epoch: agent.epoch(),
        timestamp_ms: auth::now_ms(),
        nonce: &nonce,
    };
    let proof = auth::session_proof(SECRET.as_bytes(), &claim);
    agent.open_session(&SessionRequest { claim, proof: &proof }, &ShimOrigin::Unix, &[]).unwrap().id
}

async fn requests_run_on_the_store_the_agent_was_given(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let agent = agent_on(&b, dir.path()).await;
    b.insert("t/hello", b"hello".to_vec()).await;
    let id = open(&agent);
    let elsewhere = ShimOrigin::Network { ip: "10.0.0.9".parse().unwrap(), cert: None };
    assert!(matches!(agent.scoped(&id, &elsewhere), Err(AgentError::Unauthenticated(_))));
    let s = agent.scoped(&id, &ShimOrigin::Unix).unwrap();
    let key = |key: &str| HeadObject { namespace: "d".into(), key: key.into() };

    let meta = agent.head(&s, &key("hello"), &RequestCtx::new("r1", 0)).await.unwrap();
    assert_eq!(meta.size, 5);
    let list = ListObjects { namespace: "d".into(), ..Default::default() };
    let page = agent.list(&s, &list, &RequestCtx::new("r2", 5000)).await.unwrap();
    assert_eq!(page.objects.iter().map(|o| o.key.as_str()).collect::<Vec<_>>(), ["hello"]);
    let delete = DeleteObject { namespace: "d".into(), key: "hello".into() };
    agent.delete(&s, &delete, &RequestCtx::new("r3", 0)).await.unwrap();
    assert!(b.object("t/hello").is_none());
    let e = agent.head(&s, &key("../x"), &RequestCtx::new("r4", 0)).await.unwrap_err();
    assert!(matches!(e, AgentError::BadRequest(_)), "{e}");
    assert_eq!(agent.stats(&s).requests, 4);

    agent.close_session(s).unwrap();
    assert!(matches!(agent.scoped(&id, &ShimOrigin::Unix), Err(AgentError::UnknownSession)));
}
on_every_store!(requests_run_on_the_store_the_agent_was_given);
