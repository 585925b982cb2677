//! Requests as typed values: what a client asked for, its path split and
//! checked, before it becomes an agent request. A GET alone (`Get`) and a
//! GET in a batch (a `GetMany` item) take their fields from one
//! [`GetObject`] in one place ([`GetObject::item`]), so the two cannot
//! drift apart (the agent reads both back into its own `GetObject`,
//! dpu-agent/src/requests.rs).
//!
//! Region ids here are the shim's (the client's names); the agent's ids are
//! filled in per call from the session's snapshot, which may change when
//! the agent restarts and the call is made again.

use sluice_proto::agent as apb;
use sluice_proto::common::ByteRange;
use sluice_proto::shim as pb;

use crate::error::ShimError;
use crate::path::{list_path, object_path};

/// What every agent call made for one client request carries besides its
/// body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestCtx {
    /// The client's id for the request, or one the shim made up; the agent
    /// logs it and puts it in the transfer report.
    pub request_id: String,
    /// The request's deadline in ms (the client's, at most the shim's).
    pub timeout_ms: u32,
    /// When that deadline passes: each agent call made for the request gets
    /// what is left of it, not the whole again (a call made again after the
    /// agent restarted, or one made by a request the shim already gave up
    /// on, must not outlive the request).
    pub deadline: std::time::Instant,
}

impl RequestCtx {
    /// A request with `timeout_ms` from now.
    pub fn new(request_id: String, timeout_ms: u32) -> Self {
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(u64::from(timeout_ms));
        Self { request_id, timeout_ms, deadline }
    }

    /// The deadline an agent call made now gets: what is left of the
    /// request's, at least 1 ms (the agent then ends it at once; 0 would
    /// mean none).
    pub fn agent_timeout_ms(&self) -> u32 {
        let left = self.deadline.saturating_duration_since(std::time::Instant::now()).as_millis();
        u32::try_from(left).unwrap_or(u32::MAX).clamp(1, self.timeout_ms.max(1))
    }
}

/// An object: `namespace/key` as a client writes it, split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectKey {
    pub namespace: String,
    pub key: String,
}

impl ObjectKey {
    /// Splits `ns/key`; the key must be non-empty.
    pub fn parse(path: &str) -> Result<Self, ShimError> {
        let (namespace, key) = object_path(path)?;
        Ok(Self { namespace: namespace.to_owned(), key: key.to_owned() })
    }

    /// The agent's HEAD of this object.
    pub fn head(&self, ctx: &RequestCtx, session_id: String) -> apb::HeadRequest {
        apb::HeadRequest {
            session_id,
            request_id: ctx.request_id.clone(),
            namespace: self.namespace.clone(),
            key: self.key.clone(),
            timeout_ms: ctx.agent_timeout_ms(),
        }
    }

    /// The agent's DELETE of this object.
    pub fn delete(&self, ctx: &RequestCtx, session_id: String) -> apb::DeleteRequest {
        apb::DeleteRequest {
            session_id,
            request_id: ctx.request_id.clone(),
            namespace: self.namespace.clone(),
            key: self.key.clone(),
            timeout_ms: ctx.agent_timeout_ms(),
        }
    }
}

/// One GET: which object (or range of it) into which region, alone or as
/// an item of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GetObject {
    pub object: ObjectKey,
    /// `None`: the whole object.
    pub range: Option<ByteRange>,
    /// The shim's id of the region the bytes go to.
    pub region: String,
    pub offset: u64,
    /// Most bytes the data may take from `offset` (0: to the region's end).
    pub max_bytes: u64,
    /// The ETag the object must have (empty: any).
    pub if_match: String,
}

impl TryFrom<pb::Get> for GetObject {
    type Error = ShimError;

    fn try_from(g: pb::Get) -> Result<Self, ShimError> {
        Ok(Self {
            object: ObjectKey::parse(&g.path)?,
            range: g.range,
            region: g.region_id,
            offset: g.offset,
            max_bytes: g.max_bytes,
            if_match: g.if_match,
        })
    }
}

impl GetObject {
    /// This GET as the agent names it, into the agent's region
    /// `region_id`: the one place a GET's fields become the agent's.
    pub fn item(&self, region_id: String) -> apb::GetItem {
        apb::GetItem {
            namespace: self.object.namespace.clone(),
            key: self.object.key.clone(),
            range: self.range,
            region_id,
            offset: self.offset,
            max_bytes: self.max_bytes,
            if_match: self.if_match.clone(),
            // A batch item: `<batch request id>.<index>` under the batch's deadline.
            request_id: String::new(),
            timeout_ms: 0,
        }
    }

    /// This GET as a call of its own: the same fields as [`Self::item`]
    /// (taken apart without `..`, so a field the item gains must be placed
    /// here too) with the session and the request's id and deadline.
    pub fn request(&self, ctx: &RequestCtx, session_id: String, region_id: String) -> apb::GetRequest {
        let apb::GetItem {
            namespace,
            key,
            range,
            region_id,
            offset,
            max_bytes,
            if_match,
            request_id: _,
            timeout_ms: _,
        } = self.item(region_id);
        apb::GetRequest {
            session_id,
            request_id: ctx.request_id.clone(),
            namespace,
            key,
            range,
            region_id,
            offset,
            timeout_ms: ctx.agent_timeout_ms(),
            max_bytes,
            if_match,
        }
    }
}

/// One PUT: `length` bytes at `offset` of a region become the object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PutObject {
    pub object: ObjectKey,
    /// The shim's id of the region the bytes come from.
    pub region: String,
    pub offset: u64,
    pub length: u64,
    pub content_type: String,
}

impl TryFrom<pb::Put> for PutObject {
    type Error = ShimError;

    fn try_from(p: pb::Put) -> Result<Self, ShimError> {
        Ok(Self {
            object: ObjectKey::parse(&p.path)?,
            region: p.region_id,
            offset: p.offset,
            length: p.length,
            content_type: p.content_type,
        })
    }
}

impl PutObject {
    /// The agent's PUT, from the agent's region `region_id`.
    pub fn request(&self, ctx: &RequestCtx, session_id: String, region_id: String) -> apb::PutRequest {
        apb::PutRequest {
            session_id,
            request_id: ctx.request_id.clone(),
            namespace: self.object.namespace.clone(),
            key: self.object.key.clone(),
            region_id,
            offset: self.offset,
            length: self.length,
            content_type: self.content_type.clone(),
            timeout_ms: ctx.agent_timeout_ms(),
        }
    }
}

/// One page of a listing: `namespace` or `namespace/prefix`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListObjects {
    pub namespace: String,
    /// May be empty (everything).
    pub prefix: String,
    pub continuation_token: String,
    pub max_keys: u32,
    pub delimiter: String,
}

impl TryFrom<pb::List> for ListObjects {
    type Error = ShimError;

    fn try_from(l: pb::List) -> Result<Self, ShimError> {
        let (namespace, prefix) = list_path(&l.path)?;
        Ok(Self {
            namespace: namespace.to_owned(),
            prefix: prefix.to_owned(),
            continuation_token: l.continuation_token,
            max_keys: l.max_keys,
            delimiter: l.delimiter,
        })
    }
}

impl ListObjects {
    /// The agent's LIST.
    pub fn request(&self, ctx: &RequestCtx, session_id: String) -> apb::ListRequest {
        apb::ListRequest {
            session_id,
            request_id: ctx.request_id.clone(),
            namespace: self.namespace.clone(),
            prefix: self.prefix.clone(),
            continuation_token: self.continuation_token.clone(),
            max_keys: self.max_keys,
            delimiter: self.delimiter.clone(),
            timeout_ms: ctx.agent_timeout_ms(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get() -> pb::Get {
        pb::Get {
            path: "ns/a/k".into(),
            range: Some(ByteRange { start: 5, length: Some(7) }),
            region_id: "shim-region".into(),
            offset: 3,
            max_bytes: 9,
            if_match: "\"e\"".into(),
        }
    }

    /// A GET alone and the same GET in a batch name the same thing to the
    /// agent (the agent's requests.rs checks the same from its side).
    #[test]
    fn a_get_and_a_batch_item_carry_the_same_fields() {
        let g = GetObject::try_from(get()).expect("get");
        assert_eq!(
            (g.object.namespace.as_str(), g.object.key.as_str(), g.region.as_str()),
            ("ns", "a/k", "shim-region")
        );
        let ctx = RequestCtx::new("rid".into(), 250);
        let one = g.request(&ctx, "sess".into(), "agent-region".into());
        let item = g.item("agent-region".into());
        let as_item = apb::GetItem {
            namespace: one.namespace.clone(),
            key: one.key.clone(),
            range: one.range,
            region_id: one.region_id.clone(),
            offset: one.offset,
            max_bytes: one.max_bytes,
            if_match: one.if_match.clone(),
            request_id: String::new(),
            timeout_ms: 0,
        };
        assert_eq!(as_item, item);
        assert_eq!((one.session_id.as_str(), one.request_id.as_str()), ("sess", "rid"));
        assert!((240..=250).contains(&one.timeout_ms), "what is left of 250 ms: {}", one.timeout_ms);
    }

    /// A call made late in a request (again after an agent restart, or by a
    /// request the shim gave up on) gets what is left, never the whole.
    #[test]
    fn an_agent_call_gets_what_is_left_of_the_deadline() {
        let mut ctx = RequestCtx::new("rid".into(), 10_000);
        ctx.deadline = std::time::Instant::now() + std::time::Duration::from_millis(3_000);
        assert!((2_900..=3_000).contains(&ctx.agent_timeout_ms()));
        ctx.deadline = std::time::Instant::now();
        assert_eq!(ctx.agent_timeout_ms(), 1, "past: the agent ends it at once (0 would be no deadline)");
        ctx.deadline = std::time::Instant::now() + std::time::Duration::from_secs(3_600);
        assert_eq!(ctx.agent_timeout_ms(), 10_000, "never more than the request's own");
    }

    #[test]
    fn bad_paths_are_refused_before_any_call() {
        assert!(matches!(GetObject::try_from(pb::Get { path: "ns".into(), ..get() }), Err(ShimError::BadRequest(_))));
        let put = pb::Put { path: "/k".into(), ..Default::default() };
        assert!(matches!(PutObject::try_from(put), Err(ShimError::BadRequest(_))));
        let list = ListObjects::try_from(pb::List { path: "ns".into(), ..Default::default() }).expect("list");
        assert_eq!((list.namespace.as_str(), list.prefix.as_str()), ("ns", ""));
        assert!(ListObjects::try_from(pb::List { path: "/p".into(), ..Default::default() }).is_err());
    }
}
