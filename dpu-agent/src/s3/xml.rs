//! S3 response parsing: ListObjectsV2 XML, HEAD headers, multipart XML.

use serde::Deserialize;

use super::error::S3Error;
use super::integrity::full_object_crc;
use super::model::{ListPage, ObjectMeta};

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ListBucketResult {
    #[serde(default)]
    contents: Vec<Contents>,
    #[serde(default)]
    common_prefixes: Vec<CommonPrefix>,
    #[serde(default)]
    is_truncated: bool,
    #[serde(default)]
    next_continuation_token: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Contents {
    key: String,
    #[serde(default)]
    size: u64,
    #[serde(default, rename = "ETag")]
    etag: String,
    #[serde(default)]
    last_modified: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct CommonPrefix {
    prefix: String,
}

pub(super) fn parse_list(body: &str) -> Result<ListPage, S3Error> {
    let r: ListBucketResult =
        quick_xml::de::from_str(body).map_err(|e| S3Error::Protocol(format!("ListObjectsV2 XML: {e}")))?;
    let next = match (r.is_truncated, r.next_continuation_token) {
        (true, Some(t)) if !t.is_empty() => t,
        (true, _) => return Err(S3Error::Protocol("truncated listing without NextContinuationToken".into())),
        (false, _) => String::new(),
    };
    Ok(ListPage {
        objects: r
            .contents
            .into_iter()
            .map(|c| ObjectMeta {
                key: c.key,
                size: c.size,
                etag: c.etag,
                last_modified_unix_ms: parse_rfc3339_ms(&c.last_modified),
                content_type: String::new(),
                crc64nvme: None,
                agent_crc64nvme: None,
            })
            .collect(),
        common_prefixes: r.common_prefixes.into_iter().map(|p| p.prefix).collect(),
        next_continuation_token: next,
    })
}

/// Reads HEAD / GET response headers.
pub(super) fn meta_from_headers(key: &str, h: &http::HeaderMap) -> Result<ObjectMeta, S3Error> {
    let s = |n: &str| h.get(n).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let size = s("content-length")
        .parse()
        .map_err(|_| S3Error::Protocol("HEAD response without a valid Content-Length".into()))?;
    Ok(ObjectMeta {
        key: key.to_owned(),
        size,
        etag: s("etag"),
        last_modified_unix_ms: httpdate::parse_http_date(&s("last-modified"))
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0),
        content_type: s("content-type"),
        crc64nvme: full_object_crc(h),
        agent_crc64nvme: super::integrity::agent_crc(h),
    })
}

fn parse_rfc3339_ms(s: &str) -> i64 {
    humantime::parse_rfc3339_weak(s.trim_end_matches('Z'))
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct InitiateMultipartUploadResult {
    upload_id: String,
}

pub(super) fn parse_upload_id(body: &str) -> Result<String, S3Error> {
    let r: InitiateMultipartUploadResult =
        quick_xml::de::from_str(body).map_err(|e| S3Error::Protocol(format!("CreateMultipartUpload XML: {e}")))?;
    Ok(r.upload_id)
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct CompleteMultipartUploadResult {
    #[serde(default, rename = "ETag")]
    etag: String,
}

/// CompleteMultipartUpload can fail with 200 and an `<Error>` body.
pub(super) fn parse_complete(body: &str) -> Result<String, S3Error> {
    if body.contains("<Error>") {
        return Err(S3Error::from_response(500, body, None));
    }
    let r: CompleteMultipartUploadResult =
        quick_xml::de::from_str(body).map_err(|e| S3Error::Protocol(format!("CompleteMultipartUpload XML: {e}")))?;
    Ok(r.etag)
}

pub(super) fn complete_body(etags: &[String]) -> String {
    let mut out = String::from("<CompleteMultipartUpload>");
    for (i, etag) in etags.iter().enumerate() {
        out.push_str(&format!(
            "<Part><PartNumber>{}</PartNumber><ETag>{}</ETag></Part>",
            i + 1,
            quick_xml::escape::escape(etag.as_str())
        ));
    }
    out.push_str("</CompleteMultipartUpload>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_list_pages() {
        let body = r#"<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Name>data</Name><Prefix>p/</Prefix><KeyCount>2</KeyCount><MaxKeys>2</MaxKeys><IsTruncated>true</IsTruncated>
  <Contents><Key>p/a b</Key><LastModified>2024-01-02T03:04:05.000Z</LastModified><ETag>"abc"</ETag><Size>5</Size></Contents>
  <Contents><Key>p/ü</Key><Size>0</Size></Contents>
  <CommonPrefixes><Prefix>p/dir/</Prefix></CommonPrefixes>
  <NextContinuationToken>tok</NextContinuationToken>
</ListBucketResult>"#;
        let p = parse_list(body).unwrap();
        assert_eq!(p.objects.len(), 2);
        assert_eq!(p.objects[0].key, "p/a b");
        assert_eq!(p.objects[0].size, 5);
        assert_eq!(p.objects[0].etag, "\"abc\"");
        assert_eq!(p.objects[0].last_modified_unix_ms, 1_704_164_645_000);
        assert_eq!(p.common_prefixes, vec!["p/dir/"]);
        assert_eq!(p.next_continuation_token, "tok");
    }

    #[test]
    fn empty_listing() {
        let p = parse_list("<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>").unwrap();
        assert!(p.objects.is_empty() && p.next_continuation_token.is_empty());
    }

    #[test]
    fn truncated_without_token_is_an_error() {
        assert!(parse_list("<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>").is_err());
    }

    #[test]
    fn multipart_xml() {
        assert_eq!(parse_upload_id("<InitiateMultipartUploadResult><Bucket>b</Bucket><Key>k</Key><UploadId>u-1</UploadId></InitiateMultipartUploadResult>").unwrap(), "u-1");
        assert_eq!(
            parse_complete("<CompleteMultipartUploadResult><ETag>\"e-2\"</ETag></CompleteMultipartUploadResult>")
                .unwrap(),
            "\"e-2\""
        );
        assert!(parse_complete("<Error><Code>InternalError</Code></Error>").is_err());
        let b = complete_body(&["\"a\"".into(), "\"b\"".into()]);
        assert!(b.contains("<PartNumber>2</PartNumber><ETag>&quot;b&quot;</ETag>"), "{b}");
    }
}
