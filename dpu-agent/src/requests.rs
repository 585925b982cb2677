//! Requests as typed values. A GET names the same things whether it comes
//! alone (`Get`) or in a batch (`GetMany`); both convert into [`GetObject`]
//! here, once, so the two cannot drift apart.

use sluice_proto::agent as pb;

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
        });
        assert_eq!(one, item);
        assert_eq!(one.range, Some((5, Some(7))));
        assert_eq!(one.if_match.as_deref(), Some("\"e\""));
        assert_eq!(GetObject::from(pb::GetItem::default()).if_match, None, "empty: any version");
    }
}
