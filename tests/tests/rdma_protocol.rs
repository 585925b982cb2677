//! The gateway's side of the S3-over-RDMA protocol, probed with a plain
//! SigV4-signed HTTP client and a memory owner in this test process.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use std::sync::Arc;
use std::time::SystemTime;

use aws_sigv4::http_request::{sign, PayloadChecksumKind, SignableBody, SignableRequest, SigningSettings};
use aws_sigv4::sign::v4;
use sluice_dataplane::tcp::TcpOwner;
use sluice_dataplane::{Access, Grant, SharedRegion, Token, Transport};
use sluice_tests::{boto3, pattern, sha256, Options, Stack, ACCESS_KEY, SECRET_KEY};

/// Waits until `n` bytes have landed in the window: the gateway may
/// answer a small WRITE before the owner has copied it in (posted; see
/// `sluice_dataplane::landing`).
async fn landed(exp: &sluice_dataplane::Exposure, n: u64) {
    exp.settle(n, std::time::Duration::from_secs(10)).await.expect("the bytes the gateway reported landed");
}

/// Waits until the owner has refused `total` accesses in all (a refused
/// posted WRITE is refused after the gateway answered).
async fn rejected(o: &TcpOwner, total: u64) {
    for _ in 0..1000 {
        if o.table().rejections.total() >= total {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("the owner refused {} accesses, not {total}", o.table().rejections.total());
}

struct Probe {
    base: String,
    host: String,
    http: reqwest::Client,
}

impl Probe {
    fn new(stack: &Stack) -> Self {
        let gw = stack.gateway_addr.unwrap();
        Self { base: format!("http://{gw}"), host: gw.to_string(), http: reqwest::Client::new() }
    }

    /// The headers of a request to `path` signed over `headers` (which must
    /// hold `host`): `headers` followed by the signature's.
    fn sign(&self, method: &str, path: &str, mut headers: Vec<(&'static str, String)>) -> Vec<(&'static str, String)> {
        let url = format!("{}{path}", self.base);
        let identity = aws_credential_types::Credentials::new(ACCESS_KEY, SECRET_KEY, None, None, "test").into();
        let mut settings = SigningSettings::default();
        settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region("us-east-1")
            .name("s3")
            .time(SystemTime::now())
            .settings(settings)
            .build()
            .unwrap()
            .into();
        let signable = SignableRequest::new(
            method,
            url.as_str(),
            headers.iter().map(|(n, v)| (*n, v.as_str())),
            SignableBody::UnsignedPayload,
        )
        .unwrap();
        let (instructions, _) = sign(signable, &params).unwrap().into_parts();
        let extra: Vec<(&'static str, String)> = instructions
            .headers()
            .map(|(n, v)| match n {
                "authorization" => ("authorization", v.to_owned()),
                "x-amz-date" => ("x-amz-date", v.to_owned()),
                "x-amz-content-sha256" => ("x-amz-content-sha256", v.to_owned()),
                other => panic!("unexpected signing header {other}"),
            })
            .collect();
        headers.extend(extra);
        headers
    }

    /// Sends a request signed over `signed` headers; `unsigned` headers are
    /// added after signing.
    async fn send(
        &self,
        method: &str,
        path: &str,
        signed: &[(&'static str, String)],
        unsigned: &[(&'static str, String)],
        body: Vec<u8>,
    ) -> reqwest::Response {
        let url = format!("{}{path}", self.base);
        let mut headers: Vec<(&'static str, String)> =
            vec![("host", self.host.clone()), ("content-length", body.len().to_string())];
        headers.extend(signed.iter().cloned());
        let mut rb = self.http.request(method.parse().unwrap(), &url);
        for (n, v) in self.sign(method, path, headers).iter().chain(unsigned.iter()) {
            if *n != "host" {
                rb = rb.header(*n, v);
            }
        }
        rb.body(body).send().await.unwrap()
    }

    /// The head of a signed request, as sent on the wire.
    fn raw_head(&self, method: &str, path: &str, content_length: u64) -> String {
        let headers = vec![("host", self.host.clone()), ("content-length", content_length.to_string())];
        let mut head = format!("{method} {path} HTTP/1.1\r\n");
        for (n, v) in self.sign(method, path, headers) {
            head.push_str(&format!("{n}: {v}\r\n"));
        }
        head.push_str("\r\n");
        head
    }
}

fn h(resp: &reqwest::Response, name: &str) -> Option<String> {
    resp.headers().get(name).map(|v| v.to_str().unwrap().to_owned())
}

async fn owner() -> (Arc<TcpOwner>, Arc<SharedRegion>) {
    let (o, l) = TcpOwner::bind("127.0.0.1:0".parse().unwrap(), None).await.unwrap();
    tokio::spawn(o.clone().serve(l));
    (o, Arc::new(SharedRegion::new(sluice_shm::MappedRegion::create("probe", 64 << 10).unwrap())))
}

fn grant(mem: &Arc<SharedRegion>, offset: u64, len: u64, access: Access) -> Grant {
    Grant { memory: mem.clone(), offset, len, access, tenant: "t".into(), request_id: "probe".into() }
}

fn tcp(token: &Token) -> Vec<(&'static str, String)> {
    vec![("x-amz-rdma-token", token.to_string()), ("x-sluice-rdma-transport", "tcp".into())]
}

/// Stores `data` as `key` in bucket `data` through the gateway (boto3).
fn put_object(stack: &Stack, key: &str, data: Vec<u8>) -> Vec<u8> {
    let src = stack.dir.path().join("obj");
    std::fs::write(&src, &data).unwrap();
    boto3(stack.gateway_addr.unwrap(), &["put", "data", key, src.to_str().unwrap()]);
    data
}

#[tokio::test]
async fn gateway_speaks_the_protocol() {
    let stack = Stack::start();
    let p = Probe::new(&stack);
    let (o, mem) = owner().await;
    let obj = put_object(&stack, "proto/obj", pattern(5000, 1));
    let untouched = |mem: &SharedRegion, from: usize, to: usize| mem.0.as_slice()[from..to].iter().all(|&b| b == 0);

    // A good GET: the object lands in the window, the body is empty.
    let exp = o.expose(grant(&mem, 4096, 8192, Access::RemoteWrite)).unwrap();
    let r = p.send("GET", "/data/proto/obj", &tcp(&exp.token), &[], vec![]).await;
    assert_eq!(r.status(), 200);
    assert_eq!(h(&r, "x-amz-rdma-reply").as_deref(), Some("200"));
    assert_eq!(h(&r, "x-amz-rdma-bytes-transferred").as_deref(), Some("5000"));
    assert_eq!(h(&r, "x-amz-rdma-bytes").as_deref(), Some("5000"));
    assert!(h(&r, "etag").is_some());
    assert_eq!(r.bytes().await.unwrap().len(), 0);
    landed(&exp, 5000).await;
    assert_eq!(&mem.0.as_slice()[4096..9096], &obj[..]);
    assert!(untouched(&mem, 0, 4096) && untouched(&mem, 9096, 64 << 10));
    drop(exp);

    // A ranged GET answers 206.
    mem.0.fill(0, 64 << 10, 0).unwrap();
    let exp = o.expose(grant(&mem, 0, 100, Access::RemoteWrite)).unwrap();
    let mut signed = tcp(&exp.token);
    signed.push(("range", "bytes=10-109".into()));
    let r = p.send("GET", "/data/proto/obj", &signed, &[], vec![]).await;
    assert_eq!(r.status(), 206);
    assert_eq!(h(&r, "x-amz-rdma-reply").as_deref(), Some("206"));
    assert_eq!(h(&r, "content-range").as_deref(), Some("bytes 10-109/5000"));
    landed(&exp, 100).await;
    assert_eq!(&mem.0.as_slice()[..100], &obj[10..110]);
    drop(exp);

    // A window smaller than the object: only the window is written.
    mem.0.fill(0, 64 << 10, 0).unwrap();
    let exp = o.expose(grant(&mem, 1000, 1000, Access::RemoteWrite)).unwrap();
    let mut signed = tcp(&exp.token);
    signed.push(("x-amz-checksum-mode", "ENABLED".into()));
    let r = p.send("GET", "/data/proto/obj", &signed, &[], vec![]).await;
    assert_eq!(r.status(), 206);
    assert_eq!(h(&r, "x-amz-rdma-bytes-transferred").as_deref(), Some("1000"));
    // The object's checksum describes bytes this reply did not move.
    assert_eq!(h(&r, "x-amz-checksum-crc64nvme"), None);
    landed(&exp, 1000).await;
    assert_eq!(&mem.0.as_slice()[1000..2000], &obj[..1000]);
    assert!(untouched(&mem, 0, 1000) && untouched(&mem, 2000, 64 << 10));

    // Forged descriptors: a suffix outside the window, a wrong key, a
    // direction the grant does not allow. All refused; nothing written.
    // The gateway's connection to this owner posts small WRITEs (the owner
    // said its requesters wait on their windows), so the first refusal
    // may reach the gateway only after it answered: 200 or 500. Those
    // that follow go on a fresh connection, with the handshake: 500.
    mem.0.fill(0, 64 << 10, 0).unwrap();
    let before = o.table().rejections.total();
    let forged = exp.token.with_transfer(exp.token.addr + 500, 5000);
    let r = p.send("GET", "/data/proto/obj", &tcp(&forged), &[], vec![]).await;
    assert!(matches!(r.status().as_u16(), 200 | 500), "{}", r.status());
    let mut wrong = exp.token;
    wrong.rkey ^= 1;
    let r = p.send("GET", "/data/proto/obj", &tcp(&wrong), &[], vec![]).await;
    assert_eq!(r.status(), 500);
    assert!(r.text().await.unwrap().contains("RDMATransferFailed"));
    let reader = o.expose(grant(&mem, 0, 8192, Access::RemoteRead)).unwrap();
    assert_eq!(p.send("GET", "/data/proto/obj", &tcp(&reader.token), &[], vec![]).await.status(), 500);
    assert_eq!(o.table().rejections.total() - before, 3);
    let kinds = &o.table().rejections;
    let count = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(
        (count(&kinds.out_of_window), count(&kinds.unknown_key), count(&kinds.wrong_direction)),
        (1, 1, 1),
        "each forged access refused for its own reason"
    );
    let landing = exp.landing.as_ref().expect("a tcp window counts what lands");
    assert_eq!(landing.landed(), 1000, "only the good GET's bytes landed in the window");
    assert!(untouched(&mem, 0, 64 << 10), "refused accesses wrote nothing");
    drop(exp);
    // A revoked descriptor (replay) is refused too.
    let exp = o.expose(grant(&mem, 0, 8192, Access::RemoteWrite)).unwrap();
    let replay = exp.token;
    drop(exp);
    let before = o.table().rejections.total();
    let r = p.send("GET", "/data/proto/obj", &tcp(&replay), &[], vec![]).await;
    assert!(matches!(r.status().as_u16(), 200 | 500), "{}", r.status());
    rejected(&o, before + 1).await;
    assert!(untouched(&mem, 0, 64 << 10), "a replay wrote nothing");

    // Malformed token: 400 InvalidRDMAToken, no reply header.
    let r = p.send("GET", "/data/proto/obj", &[("x-amz-rdma-token", "not-a-token".into())], &[], vec![]).await;
    assert_eq!(r.status(), 400);
    assert!(h(&r, "x-amz-rdma-reply").is_none());
    assert!(r.text().await.unwrap().contains("InvalidRDMAToken"));

    // Token header outside SignedHeaders: 403.
    let r = p.send("GET", "/data/proto/obj", &[], &tcp(&replay), vec![]).await;
    assert_eq!(r.status(), 403);

    // A standard (DC) token on a machine without RDMA: 501, retry over HTTP.
    let std_token = vec![("x-amz-rdma-token", replay.to_string())];
    let r = p.send("GET", "/data/proto/obj", &std_token, &[], vec![]).await;
    assert_eq!(r.status(), 501);
    assert_eq!(h(&r, "x-amz-rdma-reply").as_deref(), Some("501"));
    let r = p.send("PUT", "/data/proto/dc-put", &std_token, &[], vec![]).await;
    assert_eq!(h(&r, "x-amz-rdma-reply").as_deref(), Some("501"));
    assert!(!stack.stored_file("data", "proto/dc-put").exists(), "a declined PUT stores nothing");
}

/// `x-sluice-rdma-object-max`: the gateway moves nothing for a bigger
/// object and says so (`x-sluice-rdma-fits: no`, its size in
/// Content-Range), so an agent needs no HEAD to keep "nothing is written
/// unless it fits"; a bad value is refused.
#[tokio::test]
async fn gateway_moves_nothing_for_an_object_over_the_size_asked() {
    let stack = Stack::start();
    let p = Probe::new(&stack);
    let (o, mem) = owner().await;
    let obj = put_object(&stack, "fit/obj", pattern(5000, 2));
    let exp = o.expose(grant(&mem, 0, 4096, Access::RemoteWrite)).unwrap();
    let ask = |max: &str| {
        let mut signed = tcp(&exp.token);
        signed.push(("range", "bytes=0-4095".into()));
        signed.push(("x-sluice-rdma-object-max", max.to_owned()));
        signed
    };
    let r = p.send("GET", "/data/fit/obj", &ask("4999"), &[], vec![]).await;
    assert_eq!(r.status(), 206);
    assert_eq!(h(&r, "x-sluice-rdma-fits").as_deref(), Some("no"));
    assert_eq!(h(&r, "x-amz-rdma-bytes-transferred").as_deref(), Some("0"));
    assert_eq!(h(&r, "content-range").as_deref(), Some("bytes 0-4095/5000"));
    assert!(h(&r, "etag").is_some());
    assert!(mem.0.as_slice().iter().all(|&b| b == 0), "nothing was written");

    let r = p.send("GET", "/data/fit/obj", &ask("5000"), &[], vec![]).await;
    assert_eq!(r.status(), 206);
    assert_eq!(h(&r, "x-sluice-rdma-fits").as_deref(), Some("yes"));
    assert_eq!(h(&r, "x-amz-rdma-bytes-transferred").as_deref(), Some("4096"));
    landed(&exp, 4096).await;
    assert_eq!(&mem.0.as_slice()[..4096], &obj[..4096]);

    let r = p.send("GET", "/data/fit/obj", &ask("lots"), &[], vec![]).await;
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("InvalidArgument"));
    // Unsigned, it is refused: what was signed is what is checked.
    let mut signed = tcp(&exp.token);
    signed.push(("range", "bytes=0-4095".into()));
    let r = p.send("GET", "/data/fit/obj", &signed, &[("x-sluice-rdma-object-max", "1".into())], vec![]).await;
    assert_eq!(r.status(), 403);
}

/// In front of another S3 store, an RDMA PUT whose bytes do not match the
/// CRC the client sent fails before the store has its whole body, so the
/// store commits nothing. The check ran only at the body's end, which the
/// HTTP client sending it upstream never asks for once it has the
/// Content-Length: the upstream stored the bytes and the PUT answered 200.
#[tokio::test]
async fn an_upstream_store_never_gets_a_body_whose_crc_is_wrong() {
    let upstream = sluice_tests::stores::start_s3s_fs();
    let backend = format!(
        "[backend]\nkind = \"upstream\"\nendpoint = \"http://127.0.0.1:{}\"\naccess_key = \"{ACCESS_KEY}\"\n\
         secret_key = \"{SECRET_KEY}\"\n",
        upstream.port
    );
    let stack = Stack::with(Options { gateway_backend: backend, ..Default::default() });
    let p = Probe::new(&stack);
    let (o, mem) = owner().await;
    let data = pattern(60_000, 6);
    mem.0.write_at(0, &data).unwrap();
    let exp = o.expose(grant(&mem, 0, data.len() as u64, Access::RemoteRead)).unwrap();
    let mut signed = tcp(&exp.token);
    signed.push(("x-amz-checksum-crc64nvme", "AAAAAAAAAAA=".into()));
    let r = p.send("PUT", "/data/proto/up-bad-crc", &signed, &[], vec![]).await;
    assert_eq!(r.status(), 400, "{:?}", r.text().await);
    assert!(!upstream.root.path().join("data/proto/up-bad-crc").exists(), "the upstream stored it");
}

#[tokio::test]
async fn rdma_put_reads_the_window_and_verifies_crc64nvme() {
    let stack = Stack::start();
    let p = Probe::new(&stack);
    let (o, mem) = owner().await;
    let data = pattern(30_000, 5);
    mem.0.write_at(100, &data).unwrap();
    let exp = o.expose(grant(&mem, 100, data.len() as u64, Access::RemoteRead)).unwrap();

    // The right CRC-64/NVME: stored.
    let crc = {
        use base64::Engine;
        let mut d = sluice_dataplane::crc64::digest();
        d.update(&data);
        base64::engine::general_purpose::STANDARD.encode(d.finalize().to_be_bytes())
    };
    let mut signed = tcp(&exp.token);
    signed.push(("x-amz-checksum-crc64nvme", crc.clone()));
    let r = p.send("PUT", "/data/proto/put", &signed, &[], vec![]).await;
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    let r = p.send("PUT", "/data/proto/put", &signed, &[], vec![]).await;
    assert_eq!(h(&r, "x-amz-rdma-reply").as_deref(), Some("200"));
    assert_eq!(h(&r, "x-amz-rdma-bytes-transferred").as_deref(), Some("30000"));
    assert_eq!(sha256(&std::fs::read(stack.stored_file("data", "proto/put")).unwrap()), sha256(&data));

    // A wrong CRC: rejected, nothing stored.
    let mut signed = tcp(&exp.token);
    signed.push(("x-amz-checksum-crc64nvme", "AAAAAAAAAAA=".into()));
    let r = p.send("PUT", "/data/proto/bad-crc", &signed, &[], vec![]).await;
    assert_eq!(r.status(), 400);
    assert!(!stack.stored_file("data", "proto/bad-crc").exists());

    // A body alongside a token: refused.
    let r = p.send("PUT", "/data/proto/body", &tcp(&exp.token), &[], vec![1, 2, 3]).await;
    assert_eq!(r.status(), 400);
    assert!(!stack.stored_file("data", "proto/body").exists());

    // A write-only grant cannot be read.
    let w = o.expose(grant(&mem, 0, 1000, Access::RemoteWrite)).unwrap();
    let r = p.send("PUT", "/data/proto/wrong-dir", &tcp(&w.token), &[], vec![]).await;
    assert_eq!(r.status(), 500);
    assert!(!stack.stored_file("data", "proto/wrong-dir").exists());
}

// Multi-threaded: boto3 runs as a blocking child process while this
// process's memory owner serves the gateway's WRITE/READ.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boto3_with_a_before_sign_hook_speaks_it_too() {
    let stack = Stack::start();
    let gw = stack.gateway_addr.unwrap();
    let (o, mem) = owner().await;
    let obj = pattern(20_000, 3);
    let src = stack.dir.path().join("obj");
    std::fs::write(&src, &obj).unwrap();
    boto3(gw, &["put", "data", "b3/obj", src.to_str().unwrap()]);

    let exp = o.expose(grant(&mem, 512, 20_000, Access::RemoteWrite)).unwrap();
    let out: serde_json::Value =
        serde_json::from_str(&boto3(gw, &["rdma-get", "data", "b3/obj", &exp.token.to_string()])).unwrap();
    assert_eq!(out["status"], 200);
    assert_eq!(out["reply"], "200");
    assert_eq!(out["bytes"], "20000");
    assert_eq!(out["body_len"], 0);
    landed(&exp, 20_000).await;
    assert_eq!(&mem.0.as_slice()[512..20_512], &obj[..]);
    drop(exp);

    let exp = o.expose(grant(&mem, 512, 20_000, Access::RemoteRead)).unwrap();
    let out: serde_json::Value =
        serde_json::from_str(&boto3(gw, &["rdma-put", "data", "b3/copy", &exp.token.to_string()])).unwrap();
    assert_eq!(out["reply"], "200");
    assert_eq!(std::fs::read(stack.stored_file("data", "b3/copy")).unwrap(), obj);
}

/// The one-sided transport cannot be turned against the network: a token
/// naming an owner outside `[rdma] allowed_clients` is refused before any
/// connection (403), unless its transport is one the gateway declines
/// anyway (501, the client's cue to use HTTP); a token naming a listener
/// that is not a Sluice owner gets a header and not one object byte, and an
/// owner that accepts and goes silent ends at the transfer deadline (500
/// RDMATransferFailed); a PUT from an empty window is refused (400) and
/// stores nothing.
#[tokio::test]
async fn tokens_cannot_aim_the_gateway_elsewhere() {
    use tokio::io::AsyncReadExt;
    let stack =
        Stack::with(sluice_tests::Options { gateway_rdma: "transfer_timeout_ms = 700".into(), ..Default::default() });
    let p = Probe::new(&stack);
    let (o, mem) = owner().await;
    let obj = pattern(300_000, 9);
    let src = stack.dir.path().join("obj");
    std::fs::write(&src, &obj).unwrap();
    boto3(stack.gateway_addr.unwrap(), &["put", "data", "aim/obj", src.to_str().unwrap()]);
    let exp = o.expose(grant(&mem, 0, 64 << 10, Access::RemoteWrite)).unwrap();

    // An owner address outside the allowed networks (default: loopback).
    let mut far = exp.token;
    far.gid = Some(std::net::Ipv4Addr::new(10, 9, 9, 9).to_ipv6_mapped().octets());
    let r = p.send("GET", "/data/aim/obj", &tcp(&far), &[], vec![]).await;
    assert_eq!(r.status(), 403);
    assert!(r.text().await.unwrap().contains("allowed_clients"));
    // The same owner in a standard (DC) token, which this gateway (no DC
    // device) cannot serve: declined first, as the protocol says, so a
    // standard client falls back to HTTP instead of failing.
    let r = p.send("GET", "/data/aim/obj", &[("x-amz-rdma-token", far.to_string())], &[], vec![]).await;
    assert_eq!(r.status(), 501);
    assert_eq!(h(&r, "x-amz-rdma-reply").as_deref(), Some("501"));

    // Another service on an allowed address: it sees the 36-byte header,
    // never the object; the request fails at the deadline.
    let other = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut aimed = exp.token;
    aimed.lid = other.local_addr().unwrap().port();
    let seen = tokio::spawn(async move {
        let (mut s, _) = other.accept().await.unwrap();
        let mut got = Vec::new();
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), s.read_to_end(&mut got)).await;
        got.len()
    });
    let t0 = std::time::Instant::now();
    let r = p.send("GET", "/data/aim/obj", &tcp(&aimed), &[], vec![]).await;
    assert_eq!(r.status(), 500);
    assert!(r.text().await.unwrap().contains("RDMATransferFailed"));
    assert!(t0.elapsed() < std::time::Duration::from_secs(5), "ended at the deadline, not later");
    assert_eq!(seen.await.unwrap(), sluice_dataplane::tcp::wire::HEADER_LEN, "object bytes reached another service");
    drop(exp);

    // A PUT from an empty window.
    let exp = o
        .expose(grant(&mem, 0, 0, Access::RemoteRead))
        .unwrap_or_else(|_| o.expose(grant(&mem, 0, 1, Access::RemoteRead)).unwrap());
    let empty = exp.token.with_transfer(exp.token.addr, 0);
    let r = p.send("PUT", "/data/aim/empty", &tcp(&empty), &[], vec![]).await;
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("InvalidRDMAToken"));
    assert!(!stack.stored_file("data", "aim/empty").exists(), "an empty object was stored");
}

/// Clients that stop half-way hold no connection for long: a PUT whose body
/// stops after its first bytes, and a GET whose client never reads its
/// response, are closed once nothing has moved for `idle_timeout_ms`; with
/// `max_connections` of them open, the next client waits instead of being
/// served beside them, and is served once they are gone. The stopped PUT
/// stores nothing and leaves no temporary file.
#[tokio::test]
async fn stalled_clients_are_closed_and_connections_are_bounded() {
    use std::io::{Read, Write};
    use std::time::{Duration, Instant};
    let stack = Stack::with(sluice_tests::Options {
        gateway_extra: "idle_timeout_ms = 1500\nmax_connections = 4\n".into(),
        gateway_rdma: "transfer_timeout_ms = 700".into(),
        ..Default::default()
    });
    let p = Probe::new(&stack);
    let gw = stack.gateway_addr.unwrap();
    // Stored by another process, so no connection of this one is open.
    let big = put_object(&stack, "idle/big", pattern(32 << 20, 3));

    // Three PUTs that stop after 1,000 of their 1 MiB, one GET of 32 MiB
    // that is never read.
    let mut stalled: Vec<std::net::TcpStream> = (0..3)
        .map(|i| {
            let mut s = std::net::TcpStream::connect(gw).unwrap();
            s.write_all(p.raw_head("PUT", &format!("/data/idle/stopped-{i}"), 1 << 20).as_bytes()).unwrap();
            s.write_all(&[7u8; 1000]).unwrap();
            s
        })
        .collect();
    let mut reader = std::net::TcpStream::connect(gw).unwrap();
    reader.write_all(p.raw_head("GET", "/data/idle/big", 0).as_bytes()).unwrap();
    stalled.push(reader);
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_millis(200)).await;

    // A fifth client waits for a place, then gets the whole object.
    let fifth = Probe::new(&stack).send("GET", "/data/idle/big", &[], &[], vec![]).await;
    let waited = t0.elapsed();
    assert_eq!(fifth.status(), 200);
    assert_eq!(sha256(&fifth.bytes().await.unwrap()), sha256(&big));
    assert!(waited >= Duration::from_millis(1000), "the fifth client was served beside four held ones ({waited:?})");

    // Every stalled connection was closed by the gateway.
    for (i, s) in stalled.iter_mut().enumerate() {
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut sink = vec![0u8; 1 << 20];
        let closed = loop {
            match s.read(&mut sink) {
                Ok(0) => break true,
                Ok(_) => {} // a response's start, or what was buffered
                Err(e) => break e.kind() == std::io::ErrorKind::ConnectionReset,
            }
        };
        assert!(closed, "stalled connection {i} still open after {:?}", t0.elapsed());
    }
    let took = t0.elapsed();
    for i in 0..3 {
        let r = p.send("HEAD", &format!("/data/idle/stopped-{i}"), &[], &[], vec![]).await;
        assert_eq!(r.status(), 404, "a stopped PUT stored its object");
    }
    let tmp: Vec<_> = std::fs::read_dir(stack.data_dir.join(".sluice/tmp")).into_iter().flatten().flatten().collect();
    assert!(tmp.is_empty(), "temporary files left by the stopped PUTs: {tmp:?}");
    sluice_tests::report(&format!(
        "gateway: 4 stalled clients closed within {} ms; the fifth waited {} ms for a place",
        took.as_millis(),
        waited.as_millis()
    ));
}

/// A part number out of range is refused before the part's body is taken:
/// the answer comes while the client has sent none of its 64 MiB.
#[tokio::test]
async fn a_bad_part_number_is_refused_before_the_body() {
    use std::io::{Read, Write};
    let stack = Stack::start();
    let p = Probe::new(&stack);
    let r = p.send("POST", "/data/parts/obj?uploads", &[], &[], vec![]).await;
    assert_eq!(r.status(), 200);
    let xml = r.text().await.unwrap();
    let id = xml.split("<UploadId>").nth(1).and_then(|s| s.split("</UploadId>").next()).unwrap().to_owned();
    for n in ["0", "10001"] {
        let mut s = std::net::TcpStream::connect(stack.gateway_addr.unwrap()).unwrap();
        let path = format!("/data/parts/obj?partNumber={n}&uploadId={id}");
        s.write_all(p.raw_head("PUT", &path, 64 << 20).as_bytes()).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(20))).unwrap();
        let mut head = [0u8; 12];
        s.read_exact(&mut head).expect("an answer before any of the body");
        assert_eq!(&head, b"HTTP/1.1 400", "part {n}");
    }
    let r = p.send("DELETE", &format!("/data/parts/obj?uploadId={id}"), &[], &[], vec![]).await;
    assert_eq!(r.status(), 204);
}
