//! Requests as typed values: what an operation is asked ([`GetObject`],
//! [`PutObject`], [`HeadObject`], [`ListObjects`], [`DeleteObject`]) and
//! what every request carries ([`RequestCtx`]). The agent's operations take
//! these, never argument lists; protobuf converts into them here, once. A
//! GET names the same things whether it comes alone (`Get`) or in a batch
//! (`GetMany`), so both convert into [`GetObject`] and cannot drift apart.

use std::time::Duration;

use sluice_proto::agent as pb;

/// What every request carries besides its operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestCtx {
    /// The caller's id for it (logs, spans, the store's request headers).
    pub request_id: String,
    /// How long the caller gives it; `None`: the namespace's
    /// `request_timeout_ms`, which it never exceeds either way.
    pub timeout: Option<Duration>,
}

impl RequestCtx {
    /// A request `request_id` with the caller's `timeout_ms` (0: none).
    pub fn new(request_id: impl Into<String>, timeout_ms: u32) -> Self {
        let timeout = (timeout_ms > 0).then(|| Duration::from_millis(u64::from(timeout_ms)));
        Self { request_id: request_id.into(), timeout }
    }
}

/// One PUT: an object from a slice of a region.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PutObject {
    pub namespace: String,
    pub key: String,
    pub region_id: String,
    pub offset: u64,
    pub length: u64,
    pub content_type: String,
}

impl From<pb::PutRequest> for PutObject {
    fn from(r: pb::PutRequest) -> Self {
        Self {
            namespace: r.namespace,
            key: r.key,
            region_id: r.region_id,
            offset: r.offset,
            length: r.length,
            content_type: r.content_type,
        }
    }
}

/// One HEAD.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeadObject {
    pub namespace: String,
    pub key: String,
}

impl From<pb::HeadRequest> for HeadObject {
    fn from(r: pb::HeadRequest) -> Self {
        Self { namespace: r.namespace, key: r.key }
    }
}

/// One DELETE.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeleteObject {
    pub namespace: String,
    pub key: String,
}

impl From<pb::DeleteRequest> for DeleteObject {
    fn from(r: pb::DeleteRequest) -> Self {
        Self { namespace: r.namespace, key: r.key }
    }
}

/// One page of a listing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListObjects {
    pub namespace: String,
    /// Under the namespace (empty: all of it).
    pub prefix: String,
    /// From the previous page (empty: the first).
    pub continuation_token: String,
    pub max_keys: u32,
    /// Groups keys into common prefixes up to it (empty: none).
    pub delimiter: String,
}

impl From<pb::ListRequest> for ListObjects {
    fn from(r: pb::ListRequest) -> Self {
        Self {
            namespace: r.namespace,
            prefix: r.prefix,
            continuation_token: r.continuation_token,
            max_keys: r.max_keys,
            delimiter: r.delimiter,
        }
    }
}

/// One GET: which object (or range of it) into which region.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GetObject {
    pub namespace: String,
    pub key: String,
    /// `(start, length)`; `None` length: to the end. `None`: the whole object.
    pub range: Option<(u64, Option<u64>)>,
    pub region_id: String,
    pub offset: u64,
    /// Most bytes the data may take from `offset` (0: to the region's end).
    pub max_bytes: u64,
    /// The ETag the object must have (empty: any). A caller reading one
    /// object in several requests pins them to one version this way.
    pub if_match: Option<String>,
}

fn if_match(s: String) -> Option<String> {
    Some(s).filter(|s| !s.is_empty())
}

impl From<pb::GetRequest> for GetObject {
    fn from(r: pb::GetRequest) -> Self {
        Self {
            namespace: r.namespace,
            key: r.key,
            range: r.range.map(|g| (g.start, g.length)),
            region_id: r.region_id,
            offset: r.offset,
            max_bytes: r.max_bytes,
            if_match: if_match(r.if_match),
        }
    }
}

impl From<pb::GetItem> for GetObject {
    fn from(i: pb::GetItem) -> Self {
        Self {
            namespace: i.namespace,
            key: i.key,
            range: i.range.map(|g| (g.start, g.length)),
            region_id: i.region_id,
            offset: i.offset,
            max_bytes: i.max_bytes,
            if_match: if_match(i.if_match),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_get_and_a_batch_item_name_the_same_thing() {
        let range = Some(sluice_proto::common::ByteRange { start: 5, length: Some(7) });
        let one = GetObject::from(pb::GetRequest {
            namespace: "ns".into(),
            key: "k".into(),
            range,
            region_id: "r".into(),
            offset: 3,
            max_bytes: 9,
            if_match: "\"e\"".into(),
            ..Default::default()
        });
        let item = GetObject::from(pb::GetItem {
            namespace: "ns".into(),
            key: "k".into(),
            range,
            region_id: "r".into(),
            offset: 3,
            max_bytes: 9,
            if_match: "\"e\"".into(),
            ..Default::default()
        });
        assert_eq!(one, item);
        assert_eq!(one.range, Some((5, Some(7))));
        assert_eq!(one.if_match.as_deref(), Some("\"e\""));
        assert_eq!(GetObject::from(pb::GetItem::default()).if_match, None, "empty: any version");
    }

    #[test]
    fn no_timeout_is_the_namespace_deadline() {
        assert_eq!(RequestCtx::new("r", 0).timeout, None);
        assert_eq!(RequestCtx::new("r", 250).timeout, Some(Duration::from_millis(250)));
    }
}
