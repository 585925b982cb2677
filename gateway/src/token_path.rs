//! The server side of S3 over RDMA, for the gateway's [`Front`].
//!
//! A GetObject, PutObject or UploadPart that carries `x-amz-rdma-token` is
//! served by moving the bytes one-sidedly: GET WRITEs the object into the
//! client's window, PUT/UploadPart READs the body from it. The HTTP bodies
//! are empty; the reply carries `x-amz-rdma-reply`,
//! `x-amz-rdma-bytes-transferred` and the older `x-amz-rdma-bytes`.
//! Every other request passes through untouched.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use base64::Engine;
use futures::StreamExt;
use http::{HeaderMap, HeaderValue, StatusCode};
use s3s::dto::*;
use s3s::{S3Error, S3Response, S3Result, S3};
use sluice_dataplane::s3_names::{
    BYTES_HEADER, FITS_HEADER, INVALID_TOKEN, OBJECT_MAX_HEADER, OLD_BYTES_HEADER, REPLY_HEADER, TOKEN_HEADER,
    TRANSFER_FAILED, TRANSPORT_HEADER,
};
use sluice_dataplane::tcp::TcpRemote;
use sluice_dataplane::verbs::VerbsRemote;
use sluice_dataplane::{Token, TransportError, TransportKind};
use tracing::warn;

use crate::backend_errors::{error, explain_internal};
use crate::front::Front;

/// The most bytes one PUT or UploadPart may carry (S3's limit).
const MAX_PUT_BYTES: u64 = 5 << 30;

/// Counters of RDMA-path requests, for logs and tests.
#[derive(Debug, Default)]
pub struct RdmaStats {
    pub gets: AtomicU64,
    pub puts: AtomicU64,
    pub bytes: AtomicU64,
    pub declined: AtomicU64,
    pub failed: AtomicU64,
    /// Tokens refused: an owner address outside `allowed_clients`, a
    /// zero-size PUT window.
    pub refused: AtomicU64,
    /// Transfers ended by the transfer deadline.
    pub timed_out: AtomicU64,
}

/// What went wrong while an RDMA PUT body streamed.
#[derive(Debug, Default)]
pub(crate) struct PutFlags {
    transport_failed: AtomicBool,
    bad_digest: AtomicBool,
}

/// The client must retry over plain HTTP.
fn decline(msg: &str) -> S3Error {
    let mut e = error("RDMANotSupported", StatusCode::NOT_IMPLEMENTED, msg);
    let mut h = HeaderMap::new();
    h.insert(REPLY_HEADER, HeaderValue::from_static("501"));
    e.set_headers(h);
    e
}

/// Names the signed headers of a SigV4 request, read from where the
/// signature was checked: the query of a presigned URL (s3s checks a signed
/// query and then never reads the Authorization header), else the
/// Authorization header. `None`: signed both ways, which is refused (an
/// Authorization header nobody checked must not vouch for a header the
/// presigned URL never signed).
fn signed_headers(headers: &HeaderMap, uri: &http::Uri) -> Option<Vec<String>> {
    let query: Vec<&str> = uri.query().map(|q| q.split('&').collect()).unwrap_or_default();
    let query_signed = query.iter().any(|kv| kv.starts_with("X-Amz-Signature=") || kv.starts_with("X-Amz-Algorithm="));
    let auth = headers.get(http::header::AUTHORIZATION);
    if query_signed {
        if auth.is_some() {
            return None;
        }
        let names = query.iter().find_map(|kv| kv.strip_prefix("X-Amz-SignedHeaders=")).unwrap_or("");
        return Some(names.replace("%3B", ";").replace("%3b", ";").split(';').map(str::to_owned).collect());
    }
    let auth = auth.and_then(|v| v.to_str().ok()).unwrap_or("");
    let names = auth.split("SignedHeaders=").nth(1).and_then(|rest| rest.split([',', ' ']).next()).unwrap_or("");
    Some(names.split(';').map(str::to_owned).collect())
}

/// What an RDMA request asks for.
pub(crate) struct RdmaAsk {
    token: Token,
    kind: TransportKind,
    /// `x-sluice-rdma-object-max`: a GET moves nothing for a larger object.
    object_max: Option<u64>,
}

impl<S: S3> Front<S> {
    /// Refuses a token whose owner address is outside the allowed networks
    /// (no byte moves to or from it). LID-addressed tokens name no IP: the
    /// fabric, not an IP network, reaches them, and the NIC enforces rkeys.
    fn check_owner(&self, token: &Token) -> S3Result<()> {
        let Some(gid) = token.gid else { return Ok(()) };
        let v6 = std::net::Ipv6Addr::from(gid);
        let ip = v6.to_ipv4_mapped().map(std::net::IpAddr::V4).unwrap_or(std::net::IpAddr::V6(v6));
        if self.allowed.iter().any(|n| n.contains(&ip)) {
            return Ok(());
        }
        self.stats.refused.fetch_add(1, Ordering::Relaxed);
        warn!(owner = %ip, "refused an RDMA token naming an owner outside [rdma] allowed_clients");
        Err(error(
            "AccessDenied",
            StatusCode::FORBIDDEN,
            format!("the token's owner address {ip} is not in this gateway's [rdma] allowed_clients"),
        ))
    }

    /// The verbs remote serving `kind`, if it is a verbs kind this gateway serves.
    fn verbs_for(&self, kind: TransportKind) -> Option<&VerbsRemote> {
        match kind {
            TransportKind::VerbsRc => self.verbs.as_ref(),
            TransportKind::Dc => self.dc.as_ref(),
            TransportKind::Tcp => None,
        }
    }

    /// `None` for a plain request; an error for a bad, unsigned or
    /// unservable token.
    pub(crate) fn rdma_ask(&self, headers: &HeaderMap, uri: &http::Uri) -> S3Result<Option<RdmaAsk>> {
        let Some(raw) = headers.get(TOKEN_HEADER) else { return Ok(None) };
        let raw = raw.to_str().map_err(|_| error(INVALID_TOKEN, StatusCode::BAD_REQUEST, "token is not ASCII"))?;
        let token =
            Token::parse(raw.trim()).map_err(|e| error(INVALID_TOKEN, StatusCode::BAD_REQUEST, e.to_string()))?;
        let Some(signed) = signed_headers(headers, uri) else {
            return Err(error(
                "AccessDenied",
                StatusCode::FORBIDDEN,
                "a request with x-amz-rdma-token is signed either in its query or in its Authorization header, not both",
            ));
        };
        if !signed.iter().any(|h| h == TOKEN_HEADER) {
            return Err(error("AccessDenied", StatusCode::FORBIDDEN, "x-amz-rdma-token must be a SigV4 signed header"));
        }
        // A transport this gateway cannot serve is declined before the
        // owner is looked at: the protocol's 501 tells a standard client
        // (cuObject) to retry over HTTP, where a 403 would fail it, and no
        // byte moves either way. The allowlist then guards the owners the
        // gateway would actually reach.
        let transport = headers.get(TRANSPORT_HEADER).and_then(|v| v.to_str().ok());
        let kind = match transport.map(TransportKind::parse) {
            None if self.dc.is_some() => TransportKind::Dc,
            None => {
                self.stats.declined.fetch_add(1, Ordering::Relaxed);
                return Err(decline(
                    "standard (mlx5 DC) tokens need a DC-capable RDMA device; none is configured here",
                ));
            }
            Some(Some(kind @ (TransportKind::Tcp | TransportKind::VerbsRc)))
                if (kind == TransportKind::Tcp && self.tcp.is_some())
                    || (kind == TransportKind::VerbsRc && self.verbs.is_some()) =>
            {
                if !signed.iter().any(|h| h == TRANSPORT_HEADER) {
                    return Err(error("AccessDenied", StatusCode::FORBIDDEN, "x-sluice-rdma-transport must be signed"));
                }
                kind
            }
            Some(_) => {
                self.stats.declined.fetch_add(1, Ordering::Relaxed);
                return Err(decline(&format!(
                    "transport {:?} is not served by this gateway",
                    transport.unwrap_or_default()
                )));
            }
        };
        let object_max = match headers.get(OBJECT_MAX_HEADER) {
            None => None,
            // Signed, like the token: what the client asked is what is checked.
            Some(_) if !signed.iter().any(|h| h == OBJECT_MAX_HEADER) => {
                return Err(error(
                    "AccessDenied",
                    StatusCode::FORBIDDEN,
                    format!("{OBJECT_MAX_HEADER} must be signed"),
                ));
            }
            Some(v) => Some(v.to_str().ok().and_then(|v| v.trim().parse::<u64>().ok()).ok_or_else(|| {
                error("InvalidArgument", StatusCode::BAD_REQUEST, format!("{OBJECT_MAX_HEADER} must be a byte count"))
            })?),
        };
        self.check_owner(&token)?;
        Ok(Some(RdmaAsk { token, kind, object_max }))
    }

    fn tcp(&self) -> &TcpRemote {
        // rdma_ask only admits tcp requests when the remote exists.
        self.tcp.as_ref().expect("tcp transport configured")
    }

    fn reply_headers(status: u16, bytes: u64) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(REPLY_HEADER, HeaderValue::from(status));
        h.insert(BYTES_HEADER, HeaderValue::from(bytes));
        h.insert(OLD_BYTES_HEADER, HeaderValue::from(bytes));
        h
    }

    pub(crate) async fn rdma_get(
        &self,
        mut resp: S3Response<GetObjectOutput>,
        local: Option<(std::fs::File, u64, u64)>,
        ask: RdmaAsk,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        let out = &mut resp.output;
        // Without a length (an upstream store's chunked answer) the window
        // cannot be planned, and 0 would move nothing and say so as a
        // success: the client reads it over HTTP instead.
        let Some(len) = out.content_length.map(|l| l.max(0) as u64) else {
            return Err(decline("the store's answer has no Content-Length; read it over HTTP"));
        };
        if let Some(max) = ask.object_max {
            // The whole object's size: a ranged reply's total, else its length.
            let total = out.content_range.as_deref().and_then(range_total).unwrap_or(len);
            if total > max {
                // Nothing moves; the reply (Content-Range, ETag) says how big
                // the object is, so the reader can say what it needs.
                out.body = None;
                out.content_length = Some(0);
                resp.headers.extend(Self::reply_headers(if out.content_range.is_some() { 206 } else { 200 }, 0));
                resp.headers.insert(FITS_HEADER, HeaderValue::from_static("no"));
                return Ok(resp);
            }
            resp.headers.insert(FITS_HEADER, HeaderValue::from_static("yes"));
        }
        // An empty window cannot hold a byte of a non-empty answer, and no
        // Content-Range can say "none of it".
        if ask.token.size == 0 && len > 0 {
            self.stats.refused.fetch_add(1, Ordering::Relaxed);
            return Err(error(INVALID_TOKEN, StatusCode::BAD_REQUEST, "the token's window is empty"));
        }
        // Never more than the client's window; a short window makes this a
        // partial transfer, said in bytes-transferred and Content-Range.
        let n = len.min(ask.token.size);
        let body = out.body.take().map(|b| b.boxed()).unwrap_or_else(|| futures::stream::empty().boxed());
        let token = &ask.token;
        let moved = async {
            match (self.verbs_for(ask.kind), local) {
                (Some(v), Some((file, start, _))) => {
                    drop(body);
                    v.write_file(token, &file, start, n).await
                }
                (Some(v), None) => v.write_stream(token, n, body).await,
                (None, Some((file, start, _))) => {
                    drop(body);
                    self.tcp().write_file(token, &file, start, n).await
                }
                (None, None) => self.tcp().write_stream(token, n, body).await,
            }
        };
        let moved = match tokio::time::timeout(self.deadline, moved).await {
            Ok(Ok(m)) => m,
            Err(_) => {
                self.stats.failed.fetch_add(1, Ordering::Relaxed);
                self.stats.timed_out.fetch_add(1, Ordering::Relaxed);
                warn!(deadline_ms = self.deadline.as_millis() as u64, "RDMA WRITE did not finish in time");
                return Err(error(
                    TRANSFER_FAILED,
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("the one-sided transfer did not finish within {} ms", self.deadline.as_millis()),
                ));
            }
            Ok(Err(e)) => {
                self.stats.failed.fetch_add(1, Ordering::Relaxed);
                warn!(error = %e, "RDMA WRITE failed");
                return Err(error(TRANSFER_FAILED, StatusCode::INTERNAL_SERVER_ERROR, e.to_string()));
            }
        };
        self.stats.gets.fetch_add(1, Ordering::Relaxed);
        self.stats.bytes.fetch_add(moved, Ordering::Relaxed);
        let partial = out.content_range.is_some() || moved < len;
        if moved < len {
            let start = out.content_range.as_deref().and_then(parse_range_start).unwrap_or(0);
            let total = out.content_range.as_deref().and_then(range_total).unwrap_or(len);
            out.content_range = Some(format!("bytes {start}-{}/{total}", start + moved.max(1) - 1));
            // The object's checksums describe bytes this reply did not move.
            (out.checksum_crc32, out.checksum_crc32c, out.checksum_crc64nvme) = (None, None, None);
            (out.checksum_sha1, out.checksum_sha256, out.checksum_type) = (None, None, None);
        }
        out.content_length = Some(0);
        resp.status = Some(if partial { StatusCode::PARTIAL_CONTENT } else { StatusCode::OK });
        resp.headers.extend(Self::reply_headers(if partial { 206 } else { 200 }, moved));
        tracing::debug!(bytes = moved, transport = ask.kind.as_str(), "served GET over RDMA");
        Ok(resp)
    }

    /// The body of an RDMA PUT or UploadPart: the request is checked (an
    /// empty HTTP body, a window the transport can serve), then the bytes are
    /// READ from the client's window as the backend consumes them.
    pub(crate) fn rdma_put_body(
        &self,
        ask: &RdmaAsk,
        content_length: Option<i64>,
        expected_crc: Option<String>,
    ) -> S3Result<(StreamingBlob, Arc<PutFlags>, u64)> {
        Self::check_empty_body(content_length)?;
        self.check_window(ask)?;
        let flags = Arc::new(PutFlags::default());
        Ok((self.rdma_body(ask, expected_crc, flags.clone()), flags, ask.token.size))
    }

    /// The body of an RDMA PUT/UploadPart: READ from the client's window.
    /// With `x-amz-checksum-crc64nvme`, the CRC is checked as the bytes pass,
    /// and a mismatch fails the body in place of its last chunk, so the
    /// backend never has the whole object to commit. (Not at the stream's
    /// end: an HTTP client sending it upstream stops polling a body once it
    /// has its Content-Length, so that end is never reached.)
    fn rdma_body(&self, ask: &RdmaAsk, expected_crc: Option<String>, flags: Arc<PutFlags>) -> StreamingBlob {
        let token = &ask.token;
        struct St {
            inner: Pin<Box<dyn futures::Stream<Item = Result<bytes::Bytes, TransportError>> + Send + Sync>>,
            digest: sluice_dataplane::crc64::Digest,
            expected: Option<String>,
            /// Bytes read so far, of `size`.
            read: u64,
            size: u64,
            done: bool,
            flags: Arc<PutFlags>,
            deadline: tokio::time::Instant,
            limit: std::time::Duration,
            stats: Arc<RdmaStats>,
        }
        let st = St {
            inner: match self.verbs_for(ask.kind) {
                Some(v) => Box::pin(v.read_stream(token, token.size)),
                None => Box::pin(self.tcp().read_stream(token, token.size)),
            },
            digest: sluice_dataplane::crc64::digest(),
            expected: expected_crc,
            read: 0,
            size: token.size,
            done: false,
            flags,
            deadline: tokio::time::Instant::now() + self.deadline,
            limit: self.deadline,
            stats: self.stats.clone(),
        };
        let checked = futures::stream::unfold(st, |mut st| async move {
            if st.done {
                return None;
            }
            let Ok(next) = tokio::time::timeout_at(st.deadline, st.inner.next()).await else {
                // An owner that accepted and went silent: end the body, so
                // the backend commits nothing and the request fails.
                st.flags.transport_failed.store(true, Ordering::Relaxed);
                st.stats.timed_out.fetch_add(1, Ordering::Relaxed);
                st.done = true;
                let e = TransportError::Protocol(format!("no data within {} ms", st.limit.as_millis()));
                return Some((Err(e), st));
            };
            // The CRC of every byte read against the one the client sent.
            let mismatch = |st: &St| {
                let got = base64::engine::general_purpose::STANDARD.encode(st.digest.finalize().to_be_bytes());
                match &st.expected {
                    Some(want) if *want != got => {
                        st.flags.bad_digest.store(true, Ordering::Relaxed);
                        Some(TransportError::Protocol(format!("crc64nvme mismatch: sent {want}, read {got}")))
                    }
                    _ => None,
                }
            };
            match next {
                Some(Ok(b)) => {
                    st.digest.update(&b);
                    st.read += b.len() as u64;
                    if st.read >= st.size {
                        st.done = true;
                        if let Some(e) = mismatch(&st) {
                            return Some((Err(e), st));
                        }
                    }
                    Some((Ok(b), st))
                }
                Some(Err(e)) => {
                    st.flags.transport_failed.store(true, Ordering::Relaxed);
                    st.done = true;
                    Some((Err(e), st))
                }
                None => {
                    st.done = true;
                    mismatch(&st).map(|e| (Err(e), st))
                }
            }
        });
        StreamingBlob::wrap(checked)
    }

    /// A PUT reads the whole window: an empty one would store an empty
    /// object without the owner ever being asked.
    fn check_window(&self, ask: &RdmaAsk) -> S3Result<()> {
        if ask.token.size == 0 {
            self.stats.refused.fetch_add(1, Ordering::Relaxed);
            return Err(error(
                INVALID_TOKEN,
                StatusCode::BAD_REQUEST,
                "the token's window is empty; an RDMA PUT reads the object from a window of its size",
            ));
        }
        // S3's largest single PUT or part; a window past it would also pass
        // as a negative length further on.
        if ask.token.size > MAX_PUT_BYTES {
            self.stats.refused.fetch_add(1, Ordering::Relaxed);
            return Err(error(
                "EntityTooLarge",
                StatusCode::BAD_REQUEST,
                "the token's window is larger than 5 GiB, the most one PUT or part may hold",
            ));
        }
        Ok(())
    }

    fn check_empty_body(content_length: Option<i64>) -> S3Result<()> {
        if content_length.unwrap_or(0) != 0 {
            return Err(error(
                "InvalidRequest",
                StatusCode::BAD_REQUEST,
                "an RDMA PUT must have an empty body (Content-Length: 0)",
            ));
        }
        Ok(())
    }

    pub(crate) fn finish_put<T>(
        &self,
        res: S3Result<S3Response<T>>,
        flags: &PutFlags,
        len: u64,
    ) -> S3Result<S3Response<T>> {
        match res {
            Err(_) if flags.bad_digest.load(Ordering::Relaxed) => Err(error(
                "BadDigest",
                StatusCode::BAD_REQUEST,
                "x-amz-checksum-crc64nvme does not match the bytes read",
            )),
            Err(_) if flags.transport_failed.load(Ordering::Relaxed) => {
                self.stats.failed.fetch_add(1, Ordering::Relaxed);
                Err(error(TRANSFER_FAILED, StatusCode::INTERNAL_SERVER_ERROR, "RDMA READ from the client failed"))
            }
            Err(e) => Err(explain_internal(e)),
            Ok(mut resp) => {
                self.stats.puts.fetch_add(1, Ordering::Relaxed);
                self.stats.bytes.fetch_add(len, Ordering::Relaxed);
                resp.headers.extend(Self::reply_headers(200, len));
                tracing::debug!(bytes = len, "served PUT over RDMA (tcp)");
                Ok(resp)
            }
        }
    }
}

fn parse_range_start(cr: &str) -> Option<u64> {
    cr.strip_prefix("bytes ")?.split('-').next()?.parse().ok()
}

/// The object size of a `Content-Range: bytes a-b/total`.
fn range_total(cr: &str) -> Option<u64> {
    cr.rsplit('/').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backend that is never reached: these tests stop at the token.
    struct NoBackend;
    #[async_trait::async_trait]
    impl S3 for NoBackend {}

    /// A token whose owner is `ip` (an IPv4-mapped GID, as RoCE peers send).
    fn token_from(ip: [u8; 4]) -> String {
        let gid = std::net::Ipv4Addr::from(ip).to_ipv6_mapped().octets();
        let t = Token {
            addr: 0x1000,
            size: 4096,
            rkey: 7,
            lid: 1,
            dct: 3,
            gid: Some(gid),
            region_addr: 0x1000,
            region_size: 4096,
        };
        t.to_string()
    }

    /// Headers of a request whose SigV4 signature covers `signed`.
    fn request(token: &str, transport: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        let mut signed = vec!["host", TOKEN_HEADER];
        h.insert(TOKEN_HEADER, HeaderValue::from_str(token).unwrap());
        if let Some(t) = transport {
            h.insert(TRANSPORT_HEADER, HeaderValue::from_str(t).unwrap());
            signed.push(TRANSPORT_HEADER);
        }
        let auth = format!("AWS4-HMAC-SHA256 Credential=a/b, SignedHeaders={}, Signature=00", signed.join(";"));
        h.insert(http::header::AUTHORIZATION, HeaderValue::from_str(&auth).unwrap());
        h
    }

    fn status_and_reply(r: S3Result<Option<RdmaAsk>>) -> (Option<StatusCode>, Option<String>) {
        match r {
            Ok(_) => (Some(StatusCode::OK), None),
            Err(e) => {
                (e.status_code(), e.headers().and_then(|h| h.get(REPLY_HEADER)).map(|v| v.to_str().unwrap().to_owned()))
            }
        }
    }

    /// The protocol's decline comes before the allowlist: a standard (DC)
    /// token on a gateway without DC is answered 501 with
    /// `x-amz-rdma-reply: 501` (the client retries over HTTP) wherever its
    /// owner is; a transport the gateway serves still refuses an owner
    /// outside `allowed_clients` with 403.
    #[test]
    fn an_unservable_transport_is_declined_before_the_allowlist() {
        let front = Front::new(NoBackend, true, 1 << 20, None);
        let uri: http::Uri = "/data/obj".parse().unwrap();
        let (near, far) = (token_from([127, 0, 0, 1]), token_from([10, 9, 9, 9]));
        let declined = (Some(StatusCode::NOT_IMPLEMENTED), Some("501".to_owned()));
        let ask = |token: &str, transport| status_and_reply(front.rdma_ask(&request(token, transport), &uri));

        assert_eq!(ask(&far, None), declined, "DC token, owner outside allowed_clients, no DC device");
        assert_eq!(ask(&near, None), declined, "DC token, allowed owner, no DC device");
        assert_eq!(ask(&far, Some("verbs-rc")), declined, "verbs token on a gateway without verbs");
        assert_eq!(front.stats.declined.load(Ordering::Relaxed), 3);
        assert_eq!(front.stats.refused.load(Ordering::Relaxed), 0, "declines are not allowlist refusals");

        assert_eq!(ask(&far, Some("tcp")), (Some(StatusCode::FORBIDDEN), None), "tcp token, owner outside");
        assert_eq!(front.stats.refused.load(Ordering::Relaxed), 1);
        assert_eq!(ask(&near, Some("tcp")), (Some(StatusCode::OK), None), "tcp token, allowed owner");
    }

    /// Which headers are signed is read from where the signature is
    /// checked. A presigned URL signs only `host`: an Authorization header
    /// added beside it (which s3s never checks then) must not make the
    /// token count as signed.
    #[test]
    fn a_token_is_signed_only_where_the_signature_is_checked() {
        let front = Front::new(NoBackend, true, 1 << 20, None);
        let token = token_from([127, 0, 0, 1]);
        let forbidden = (Some(StatusCode::FORBIDDEN), None);
        let presigned: http::Uri =
            "/data/obj?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-SignedHeaders=host&X-Amz-Signature=ab".parse().unwrap();
        // A forged Authorization header naming the token beside the query.
        let forged = request(&token, Some("tcp"));
        assert_eq!(status_and_reply(front.rdma_ask(&forged, &presigned)), forbidden, "signed both ways");
        let mut bare = forged.clone();
        bare.remove(http::header::AUTHORIZATION);
        assert_eq!(status_and_reply(front.rdma_ask(&bare, &presigned)), forbidden, "the query signs only host");
        // A presigned URL that does sign the token (and the transport).
        let signs: http::Uri = "/data/obj?X-Amz-Algorithm=AWS4-HMAC-SHA256\
            &X-Amz-SignedHeaders=host%3bx-amz-rdma-token%3Bx-sluice-rdma-transport&X-Amz-Signature=ab"
            .parse()
            .unwrap();
        assert_eq!(status_and_reply(front.rdma_ask(&bare, &signs)), (Some(StatusCode::OK), None));
        // The header way, as ever.
        let plain: http::Uri = "/data/obj".parse().unwrap();
        assert_eq!(status_and_reply(front.rdma_ask(&forged, &plain)), (Some(StatusCode::OK), None));
    }
}
