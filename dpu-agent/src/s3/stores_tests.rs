//! The stores the transfer tests run against, behind one [`Backend`]: the
//! in-memory [`MockStore`], and a real `sluice-gateway` started in the
//! test's own process on `127.0.0.1:0` over a temporary directory, reached
//! through the agent's SigV4 [`HttpClient`]. A test body takes a `Backend`
//! and runs unchanged on both (`on_every_store!`), as mountpoint-s3 runs
//! its read tests on its mock and on S3; [`super::failing::Failing`] wraps
//! either client.

use std::sync::Arc;

use bytes::Bytes;

use super::client::{PutBody, S3Client, Target};
use super::http_client::{pool, HttpClient};
use super::mock::MockStore;
use super::sigv4::Keys;
use super::store::ObjectStore;
use super::transfer_tests::{counters, tuning, PART};
use crate::config::{NamespaceConfig, S3Tuning};

const BUCKET: &str = "data";
const ACCESS_KEY: &str = "transfer-tests";
const SECRET_KEY: &str = "transfer-tests-secret";

/// Where a test's objects live.
pub(crate) enum Backend {
    Mock(MockStore),
    Gateway {
        client: Arc<HttpClient>,
        endpoint: String,
        /// The gateway's data directory (removed when the test ends).
        dir: tempfile::TempDir,
    },
}

/// Runs the test body `$body` (an async fn taking a [`Backend`]) once on
/// the in-memory store and once on a real gateway, as two tests.
macro_rules! on_every_store {
    ($body:ident) => {
        mod $body {
            #[tokio::test]
            async fn on_the_mock() {
                super::$body(crate::s3::stores_tests::Backend::mock()).await
            }

            #[tokio::test]
            async fn on_a_gateway() {
                super::$body(crate::s3::stores_tests::Backend::gateway().await).await
            }
        }
    };
}
pub(crate) use on_every_store;

impl Backend {
    pub fn mock() -> Self {
        Self::Mock(MockStore::new())
    }

    /// A gateway serving bucket `data` from a fresh directory, in this
    /// test's runtime (it stops with the test).
    pub async fn gateway() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let cfg: sluice_gateway::GatewayConfig = toml::from_str(&format!(
            "listen = \"127.0.0.1:0\"\ndata_dir = {:?}\nbuckets = [\"{BUCKET}\"]\n\
             [[credentials]]\naccess_key = \"{ACCESS_KEY}\"\nsecret_key = \"{SECRET_KEY}\"\n",
            dir.path()
        ))
        .unwrap();
        let gateway = sluice_gateway::Gateway::bind(&cfg).await.unwrap();
        let endpoint = format!("http://{}", gateway.local_addr().unwrap());
        tokio::spawn(gateway.serve(std::future::pending()));
        let keys = Keys { access_key: ACCESS_KEY.into(), secret_key: SECRET_KEY.into(), session_token: None };
        let http = pool(&S3Tuning::default(), &[]).unwrap();
        let client = Arc::new(HttpClient::new(http, BUCKET.into(), keys, "us-east-1".into()));
        Self::Gateway { client, endpoint, dir }
    }

    /// The part size the tests use: S3's smallest multipart part on a
    /// real store (which refuses smaller ones), a small one in memory.
    pub fn part(&self) -> u64 {
        match self {
            Self::Mock(_) => PART,
            Self::Gateway { .. } => 5 << 20,
        }
    }

    /// The client stores send through.
    pub fn client(&self) -> Arc<dyn S3Client> {
        match self {
            Self::Mock(m) => Arc::new(m.clone()),
            Self::Gateway { client, .. } => client.clone(),
        }
    }

    /// The in-memory store, for what only it records (the requests sent).
    pub fn as_mock(&self) -> Option<&MockStore> {
        match self {
            Self::Mock(m) => Some(m),
            Self::Gateway { .. } => None,
        }
    }

    /// Namespace `d` with prefix `t/` on this store: three endpoints in
    /// memory (requests spread and retry across them), the gateway's one.
    pub fn namespace(&self) -> NamespaceConfig {
        let endpoints = match self {
            Self::Mock(_) => "\"http://a:1\", \"http://b:2\", \"http://c:3\"".to_owned(),
            Self::Gateway { endpoint, .. } => format!("{endpoint:?}"),
        };
        toml::from_str(&format!(
            "name = \"d\"\nendpoints = [{endpoints}]\nbucket = \"{BUCKET}\"\ncredentials = \"c\"\nprefix = \"t/\"\n"
        ))
        .unwrap()
    }

    /// The tests' tuning with this store's part size.
    pub fn tuning(&self) -> S3Tuning {
        let part = self.part();
        S3Tuning { get_part_size: part, multipart_threshold: 4 * part, put_part_size: part, ..tuning() }
    }

    /// A store on this backend whose requests go through `wrap(client)`
    /// (a `Failing`, or the client itself).
    pub fn store_with(&self, wrap: impl FnOnce(Arc<dyn S3Client>) -> Arc<dyn S3Client>) -> ObjectStore {
        ObjectStore::new(wrap(self.client()), &self.namespace(), "tenant", self.tuning(), counters(), None)
    }

    pub fn store(&self) -> ObjectStore {
        self.store_with(|c| c)
    }

    /// Stores `data` as stored key `full` (prefix included), around the
    /// store under test.
    pub async fn insert(&self, full: &str, data: Vec<u8>) {
        match self {
            Self::Mock(m) => m.insert(full, data),
            Self::Gateway { client, endpoint, .. } => {
                let at = Target { endpoint, key: full, request_id: "seed", attempt: 0 };
                client.put(at, None, &[], PutBody::Bytes(Bytes::from(data))).await.unwrap();
            }
        }
    }

    /// What is stored as `full`, read around the store under test: the
    /// gateway's file itself, an oracle that shares no code with it.
    pub fn object(&self, full: &str) -> Option<Vec<u8>> {
        match self {
            Self::Mock(m) => m.object(full).map(|b| b.to_vec()),
            Self::Gateway { dir, .. } => std::fs::read(dir.path().join(BUCKET).join(full)).ok(),
        }
    }
}
