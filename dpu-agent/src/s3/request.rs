//! Building and SigV4-signing one S3 request.

use std::time::SystemTime;

use aws_sigv4::http_request::{
    sign, PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest, SigningSettings,
    UriPathNormalizationMode,
};
use aws_sigv4::sign::v4;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use super::{ObjectStore, S3Error};

/// Characters S3 wants encoded in a key path: all but unreserved and '/'.
const PATH: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~').remove(b'/');
/// Query values: all but unreserved.
const QUERY: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~');

/// What goes in the body, for signing and sending.
pub(super) enum Payload {
    /// No body.
    Empty,
    /// A small body held in memory (signed with its SHA-256).
    Bytes(bytes::Bytes),
    /// A streamed body of known length (signed as UNSIGNED-PAYLOAD).
    Stream { body: reqwest::Body, len: u64 },
}

/// A request under construction.
pub(super) struct Spec<'a> {
    method: http::Method,
    endpoint: &'a str,
    key: Option<&'a str>,
    query: Vec<(&'static str, String)>,
    headers: Vec<(&'static str, String)>,
    payload: Payload,
}

impl<'a> Spec<'a> {
    pub fn new(method: http::Method, endpoint: &'a str) -> Self {
        Self { method, endpoint, key: None, query: Vec::new(), headers: Vec::new(), payload: Payload::Empty }
    }
    pub fn key(mut self, key: &'a str) -> Self {
        self.key = Some(key);
        self
    }
    pub fn query(mut self, name: &'static str, value: &str) -> Self {
        self.query.push((name, value.to_owned()));
        self
    }
    pub fn header(mut self, name: &'static str, value: String) -> Self {
        self.headers.push((name, value));
        self
    }
    pub fn payload(mut self, payload: Payload) -> Self {
        self.payload = payload;
        self
    }
}

impl ObjectStore {
    /// Signs and sends `spec`; transport failures become retryable errors.
    /// The caller checks the status.
    pub(super) async fn send(&self, spec: Spec<'_>, request_id: &str) -> Result<reqwest::Response, S3Error> {
        self.build(spec, request_id)?.send().await.map_err(S3Error::from_reqwest)
    }

    /// Signs `spec` into a request ready to send; it owns everything it
    /// needs, so it can be sent from a task of its own (a cleanup started
    /// while the request that needed it is being dropped).
    pub(super) fn build(&self, spec: Spec<'_>, request_id: &str) -> Result<reqwest::RequestBuilder, S3Error> {
        let mut url = format!("{}/{}", spec.endpoint, self.bucket);
        if let Some(k) = spec.key {
            url.push('/');
            url.extend(utf8_percent_encode(k, PATH));
        }
        if !spec.query.is_empty() {
            url.push('?');
            let q: Vec<String> =
                spec.query.iter().map(|(n, v)| format!("{n}={}", utf8_percent_encode(v, QUERY))).collect();
            url.push_str(&q.join("&"));
        }
        let host = host_of(spec.endpoint)?;
        let mut headers: Vec<(&str, String)> = vec![("host", host)];
        headers.extend(spec.headers.iter().map(|(n, v)| (*n, v.clone())));
        let (signable_body, body, len) = match &spec.payload {
            Payload::Empty => (SignableBody::Bytes(&[]), None, 0),
            Payload::Bytes(b) => (SignableBody::Bytes(b), Some(reqwest::Body::from(b.clone())), b.len() as u64),
            Payload::Stream { len, .. } => (SignableBody::UnsignedPayload, None, *len),
        };
        if !matches!(spec.payload, Payload::Empty) || spec.method == http::Method::PUT {
            headers.push(("content-length", len.to_string()));
        }

        let identity = self.credentials.clone().into();
        let mut settings = SigningSettings::default();
        settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
        settings.percent_encoding_mode = PercentEncodingMode::Single;
        settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region(&self.region)
            .name("s3")
            .time(SystemTime::now())
            .settings(settings)
            .build()
            .map_err(|e| S3Error::Protocol(format!("signing parameters: {e}")))?
            .into();
        let signable = SignableRequest::new(
            spec.method.as_str(),
            url.as_str(),
            headers.iter().map(|(n, v)| (*n, v.as_str())),
            signable_body,
        )
        .map_err(|e| S3Error::Protocol(format!("signing: {e}")))?;
        let (instructions, _) =
            sign(signable, &params).map_err(|e| S3Error::Protocol(format!("signing: {e}")))?.into_parts();

        let mut rb = self.http.request(spec.method.clone(), &url).header("x-sluice-request-id", request_id);
        for (n, v) in &headers {
            if *n != "host" {
                rb = rb.header(*n, v);
            }
        }
        for (n, v) in instructions.headers() {
            rb = rb.header(n, v);
        }
        Ok(match spec.payload {
            Payload::Empty => rb,
            Payload::Bytes(_) => rb.body(body.unwrap_or_else(|| reqwest::Body::from(Vec::new()))),
            Payload::Stream { body, .. } => rb.body(body),
        })
    }
}

/// `host[:port]` of an endpoint URL, as the Host header carries it.
fn host_of(endpoint: &str) -> Result<String, S3Error> {
    let rest = endpoint
        .strip_prefix("http://")
        .or_else(|| endpoint.strip_prefix("https://"))
        .ok_or_else(|| S3Error::Protocol(format!("endpoint {endpoint:?} is not an http(s) URL")))?;
    Ok(rest.split('/').next().unwrap_or(rest).to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_encoded_like_s3_expects() {
        let enc: String = utf8_percent_encode("dir/a b+ü~.txt", PATH).collect();
        assert_eq!(enc, "dir/a%20b%2B%C3%BC~.txt");
        let q: String = utf8_percent_encode("a/b c", QUERY).collect();
        assert_eq!(q, "a%2Fb%20c");
    }

    #[test]
    fn host_header() {
        assert_eq!(host_of("http://127.0.0.1:9000").unwrap(), "127.0.0.1:9000");
        assert_eq!(host_of("https://s3.example.com/").unwrap(), "s3.example.com");
        assert!(host_of("ftp://x").is_err());
    }
}
