//! GetObject into host memory: the first ranged GET learns the object size,
//! the rest of a large object is fetched as concurrent ranged GETs spread
//! across the namespace's endpoints, each streaming its body straight into its
//! own slice of the destination region (no whole-object buffer).

use std::future::Future;
use std::pin::Pin;

use futures::{StreamExt, TryStreamExt};

use super::body::land;
use super::call::{enter, Call, ObjectRead, PartGet, RegionSlice};
use super::client::{RangedGet, Reply};
use super::error::S3Error;
use super::integrity::{self, unverified, Expected};
use super::rdma_parts::{FirstAsk, FirstTry};
use super::store::ObjectStore;
use super::token_path::{Fallback, Via};
use super::version::{reply_span, Version};
use crate::model::DataPathMode;

/// What a GET moved.
#[derive(Debug, Clone)]
pub struct GetOutcome {
    /// Bytes written into the region.
    pub bytes: u64,
    /// Size of the whole object.
    pub object_size: u64,
    pub etag: String,
    /// S3 requests that carried data.
    pub parts: u32,
    /// Parts that moved over RDMA.
    pub rdma_parts: u32,
    /// Parts that were meant for RDMA but went over HTTP, and why.
    pub fallbacks: Vec<Fallback>,
    /// Why the bytes could not be checked end to end; `None`: they were.
    pub unverified: Option<String>,
    /// A first part tried without a HEAD that fell back (the span then
    /// moved the HEAD way, as `parts` and `fallbacks` say): counted as a
    /// fallback, not as the way the bytes went.
    pub first_try: Option<Fallback>,
}

impl GetOutcome {
    pub(super) fn from_parts(
        bytes: u64,
        object_size: u64,
        etag: String,
        vias: Vec<Via>,
        unverified: Option<&str>,
    ) -> Self {
        let rdma_parts = vias.iter().filter(|v| matches!(v, Via::Rdma)).count() as u32;
        let fallbacks =
            vias.iter().filter_map(|v| if let Via::Fallback(f) = v { Some(f.clone()) } else { None }).collect();
        let unverified = unverified.map(str::to_owned);
        Self { bytes, object_size, etag, parts: vias.len() as u32, rdma_parts, fallbacks, unverified, first_try: None }
    }
}

type PartFuture<'a> = Pin<Box<dyn Future<Output = Result<PartDone, S3Error>> + Send + 'a>>;

/// One part of a GET, landed: where, how, and the CRC64NVME of its bytes
/// when they passed through the agent (HTTP: computed as they streamed, so
/// checking the whole object costs no second pass over memory).
struct PartDone {
    via: Via,
    dst: u64,
    len: u64,
    crc: Option<u64>,
}

/// The first HTTP response of a GET, which carries the first part.
struct FirstPart {
    resp: Reply,
    body_start: u64,
    /// End (exclusive) of what was asked for.
    asked_end: u64,
    /// The object's checksums this reply carried: the agent's (metadata
    /// comes with every GET reply) and the store's (only with the whole
    /// object), so a whole-object read needs no HEAD to find one.
    expected: Expected,
}

/// What the first ranged GET learned.
enum First {
    /// The object's size and ETag, and the reply carrying its first part.
    Part { object_size: u64, etag: String, part: FirstPart },
    /// A 0-byte object (no range is satisfiable; HEAD confirmed it).
    Empty { etag: String },
}

/// The fair-scheduler cost of a GET's first part, before the object's size
/// is known: what it can move, i.e. at most a part, the range asked for and
/// the room in the destination. A whole-object GET into a 4 KiB slot costs
/// 4 KiB, not a part (a bigger object would not fit and fails before its
/// body is read); charging a part would give a tenant of small objects a
/// part-size share of the scheduler per object.
pub(super) fn first_part_cost(length: Option<u64>, part: u64, fits: u64) -> u64 {
    length.unwrap_or(part).min(part).min(fits).max(1)
}

impl ObjectStore {
    /// Reads `key` (or `length` bytes from `start`; `None` = to the end) into
    /// `region` at `offset`. Nothing is written unless the whole requested
    /// span fits in the region, and in `room` bytes (a caller's slot).
    /// `if_match`: the ETag the object must have (a caller reading one object
    /// in several requests pins them to the version its first one saw);
    /// another version fails with PRECONDITION_FAILED before a byte is written.
    pub async fn get_into(
        &self,
        read: &ObjectRead<'_>,
        into: &RegionSlice<'_>,
        call: &Call<'_>,
    ) -> Result<GetOutcome, S3Error> {
        let ObjectRead { key, start, length, if_match } = *read;
        let RegionSlice { region, offset, room } = *into;
        let Call { request_id, gate } = *call;
        if length == Some(0) {
            return Err(S3Error::InvalidRange("a range must cover at least one byte".into()));
        }
        // A region only the NIC reaches (GPU memory on a co-located agent) is
        // refused before anything moves when this namespace would need HTTP,
        // staging, the CPU or a checksum pass.
        self.check_reach(region.as_ref(), super::gpu::Direction::Get)?;
        if let Some(enc) = &self.encryption {
            return self.get_encrypted(enc, read, into, call).await;
        }
        let full = self.full_key(key);
        let part = self.tuning.get_part_size;
        let base = self.next_base();
        let rdma = self.rdma.as_ref();

        // Learn the size and ETag: with data_path = "rdma" from a HEAD (every
        // byte then moves over RDMA), otherwise from a first ranged GET that
        // also carries the first part. Either reply also carries the
        // checksums a whole object is checked against at the end.
        let rdma_mode = rdma.is_some_and(|r| r.mode == DataPathMode::Rdma);
        let fits = room.min(region.len().saturating_sub(offset));
        // A first part without a HEAD that fell back is reported with the
        // request's other fallbacks.
        let mut first_fallback = None;
        let (object_size, etag, first, expected, landed) = if rdma_mode {
            // On Sluice's own transport the first part needs no HEAD.
            let tried = match rdma {
                Some(r) => {
                    let _slot = enter(gate, first_part_cost(length, part, fits)).await?;
                    let ask =
                        FirstAsk { key, full: &full, start, length, if_match, region, offset, fits, base, request_id };
                    self.first_part_rdma(r, ask).await?
                }
                None => FirstTry::HeadWay(None),
            };
            match tried {
                FirstTry::Landed(l) => (l.object_size, l.etag, None, l.expected, l.landed),
                FirstTry::HeadWay(fell_back) => {
                    first_fallback = fell_back;
                    // Its own base would move the round-robin on by two per
                    // GET: with an even number of endpoints, some would then
                    // never take a first part and never learn the size check.
                    let meta = self.head_from(key, request_id, base + 1).await?;
                    if start >= meta.size && !(start == 0 && meta.size == 0) {
                        return Err(S3Error::InvalidRange(format!("bytes {start}- of a {}-byte object", meta.size)));
                    }
                    let expected = Expected { store: meta.crc64nvme, agent: meta.agent_crc64nvme };
                    (meta.size, meta.etag, None, expected, 0)
                }
            }
        } else {
            // The first part's slot is held until its body has streamed.
            let cost = first_part_cost(length, part, fits);
            let slot = enter(gate, cost).await?;
            match self.first_part(key, &full, start, length, base, request_id).await? {
                First::Part { object_size, etag, part } => {
                    let expected = part.expected;
                    (object_size, etag, Some((part, slot)), expected, 0)
                }
                First::Empty { etag } => (0, etag, None, Expected::default(), 0),
            }
        };
        // Before any byte of the first part is written (its body is still
        // unread): a version other than the one asked for is refused.
        // A first try that broke mid-transfer may have left bytes in the
        // slot: a refusal now must not claim nothing was written.
        let touched =
            first_fallback.as_ref().is_some_and(|f| matches!(f.kind, "short" | "transfer_failed" | "transport"));
        let refused = |e: S3Error| {
            if !touched {
                return e;
            }
            S3Error::TransferFailed {
                message: format!("{e}; a first try broke before it and may have left bytes in the slot"),
                attempts: 1,
            }
        };
        check_if_match(if_match, &etag).map_err(refused)?;
        let end = match length {
            Some(l) => start.saturating_add(l).min(object_size),
            None => object_size,
        };
        let needed = end.saturating_sub(start);
        if region.check(offset, needed).is_err() || offset > region.len() || needed > room {
            return Err(refused(S3Error::DoesNotFit {
                needed,
                offset,
                region_len: region.len().min(offset.saturating_add(room)),
            }));
        }
        if needed == 0 {
            // Nothing was read that could be damaged (the size came from the store).
            return Ok(GetOutcome::from_parts(0, object_size, etag, vec![Via::Http], None));
        }

        let (full, etag) = (&full, &etag);
        let version = Version { etag, size: object_size };
        let part_of = |from, to, dst, base| PartGet { full, from, to, version, region, dst, base, request_id };
        // A whole-object read is checked end to end against the object's
        // CRC64NVME, as the first reply carried it; otherwise the outcome
        // says why it was not.
        let unverified = if !self.verify_checksums {
            Some(unverified::DISABLED)
        } else if start != 0 || needed != object_size {
            Some(unverified::RANGED)
        } else if !expected.any() {
            Some(unverified::NO_CHECKSUM)
        } else {
            None
        };
        let mut futs: Vec<PartFuture<'_>> = Vec::new();
        let mut pos = start;
        if landed > 0 {
            // The first part is in already (RDMA, no HEAD).
            futs.push(Box::pin(std::future::ready(Ok(PartDone {
                via: Via::Rdma,
                dst: offset,
                len: landed,
                crc: None,
            }))));
            pos += landed;
        }
        let first_sent = first.is_some() || landed > 0;
        if let Some((FirstPart { mut resp, body_start, asked_end, .. }, slot)) = first {
            let cover = asked_end.min(end);
            futs.push(Box::pin(async move {
                let _slot = slot;
                let len = cover - body_start;
                let crc = match land(&mut resp.body, region, offset, len).await {
                    Ok(crc) => crc,
                    Err(e) if e.is_retryable() => {
                        tracing::warn!(error = %e, "first part broke; re-fetching it");
                        self.fetch_range(part_of(start, cover, offset, base)).await?
                    }
                    Err(e) => return Err(e),
                };
                Ok(PartDone { via: Via::Http, dst: offset, len, crc: Some(crc) })
            }));
            pos = cover;
        }
        // Parts go round the endpoints from the one the first request used;
        // after a HEAD (no first part), the first part goes to the endpoint
        // a HEAD-less first part would have used, so that endpoint shows
        // whether it checks the size (`first_part_rdma`).
        let mut i = usize::from(first_sent);
        while pos < end {
            let stop = pos.saturating_add(part).min(end);
            let use_rdma = rdma.filter(|r| r.mode == DataPathMode::Rdma || stop - pos >= r.min_bytes);
            let (from, dst) = (pos, offset + (pos - start));
            futs.push(Box::pin(async move {
                let _slot = enter(gate, stop - from).await?;
                let len = stop - from;
                if let Some(r) = use_rdma {
                    match self.get_part_rdma(r, part_of(from, stop, dst, base + i)).await? {
                        None => return Ok(PartDone { via: Via::Rdma, dst, len, crc: None }),
                        Some(f) => {
                            tracing::warn!(kind = f.kind, reason = %f.message, from, to = stop, "RDMA GET part fell back to HTTP");
                            let crc = self.fetch_range(part_of(from, stop, dst, base + i)).await?;
                            return Ok(PartDone { via: Via::Fallback(f), dst, len, crc: Some(crc) });
                        }
                    }
                }
                let crc = self.fetch_range(part_of(from, stop, dst, base + i)).await?;
                Ok(PartDone { via: Via::Http, dst, len, crc: Some(crc) })
            }));
            pos = stop;
            i += 1;
        }
        let parts = async {
            // Quiet: the set's own yield after each poll would wake
            // another runtime worker for every chunk read (crate::quiet).
            crate::quiet::Quiet::new(futures::stream::iter(futs).buffer_unordered(self.tuning.max_concurrency))
                .try_collect::<Vec<PartDone>>()
                .await
                // The range was checked against the first reply: a later
                // part out of range means the object shrank meanwhile.
                .map_err(|e| match e {
                    S3Error::InvalidRange(m) => {
                        S3Error::PreconditionFailed(format!("the object changed while it was read (now shorter: {m})"))
                    }
                    e => e,
                })
        };
        let mut done = parts.await?;
        if unverified.is_none() {
            // The parts' CRCs, in order, combined into the object's; parts
            // that landed by RDMA are read back for theirs.
            done.sort_by_key(|p| p.dst);
            let mut got: Option<u64> = None;
            for p in &done {
                let c = match p.crc {
                    Some(c) => c,
                    None => {
                        let c = super::token_path::crc64nvme_of(region, p.dst, p.len).await?;
                        // Small parts are summed on this task: many of them
                        // in a row must still let other tasks run.
                        tokio::task::consume_budget().await;
                        c
                    }
                };
                got = Some(integrity::combine(got, c, p.len));
            }
            expected.check(got.unwrap_or(0))?;
        }
        let vias = done.into_iter().map(|p| p.via).collect();
        let mut out = GetOutcome::from_parts(needed, object_size, etag.clone(), vias, unverified);
        out.first_try = first_fallback;
        Ok(out)
    }

    /// The first ranged GET. `Ok(Err(etag))` for an empty object (whose
    /// range is unsatisfiable), confirmed by HEAD.
    async fn first_part(
        &self,
        key: &str,
        full: &str,
        start: u64,
        length: Option<u64>,
        base: usize,
        request_id: &str,
    ) -> Result<First, S3Error> {
        let first_len = length.unwrap_or(u64::MAX).min(self.tuning.get_part_size);
        let first_end = start.saturating_add(first_len - 1);
        let first = self
            .retrying(|attempt| async move {
                // Stores send the full-object checksum when the reply holds
                // the whole object.
                let req = RangedGet { first: start, last: first_end, checksum_mode: start == 0, ..Default::default() };
                let at = self.at(base, attempt, full, request_id);
                Ok((self.client.get(at, req).await?, at.endpoint))
            })
            .await;
        let (resp, endpoint) = match first {
            Ok(r) => r,
            // A 0-byte object has no satisfiable range: confirm with HEAD.
            Err(S3Error::InvalidRange(_)) if start == 0 => {
                let meta = self.head(key, request_id).await?;
                if meta.size != 0 {
                    return Err(S3Error::InvalidRange(format!("bytes {start}- of a {}-byte object", meta.size)));
                }
                return Ok(First::Empty { etag: meta.etag });
            }
            Err(e) => return Err(e),
        };
        let (body_start, object_size, etag) = reply_span(&resp, start, first_end)?;
        // (Saturating: a start near u64::MAX, which no object reaches.)
        let asked_end = first_end.saturating_add(1);
        let whole = body_start == 0 && asked_end >= object_size;
        let expected = Expected::from_headers(&resp.headers, whole);
        self.note_checksums(endpoint, whole, &expected, &etag);
        let part = FirstPart { resp, body_start, asked_end, expected };
        Ok(First::Part { object_size, etag, part })
    }

    /// A whole single-part object the agent stored with a checksum shows
    /// whether the store keeps checksums (a multipart one may have none even
    /// where single PUTs do).
    pub(super) fn note_checksums(&self, endpoint: &str, whole: bool, expected: &Expected, etag: &str) {
        if whole && (expected.store.is_some() || (expected.agent.is_some() && integrity::single_part(etag))) {
            self.learned.get_reply(endpoint, expected.store.is_some());
        }
    }

    /// A ranged GET of `[from, to)`; `If-Match` on the ETag guards against
    /// the object changing between parts (HTTP and RDMA parts alike).
    pub(super) fn part_get(from: u64, to: u64, etag: &str) -> RangedGet<'_> {
        RangedGet { first: from, last: to - 1, if_match: (!etag.is_empty()).then_some(etag), ..Default::default() }
    }

    /// Fetches `[from, to)` into `region` at `dst`, with retries. `If-Match`
    /// asks the store to refuse another version; the reply is checked to be
    /// of `version` all the same (a store may ignore `If-Match`).
    async fn fetch_range(&self, part: PartGet<'_>) -> Result<u64, S3Error> {
        let PartGet { full, from, to, version, region, dst, base, request_id } = part;
        self.retrying(|attempt| async move {
            let req = Self::part_get(from, to, version.etag);
            let mut resp = self.client.get(self.at(base, attempt, full, request_id), req).await?;
            if resp.status != http::StatusCode::PARTIAL_CONTENT {
                return Err(S3Error::Protocol(format!("ranged GET answered {}", resp.status)));
            }
            version.check_http(&resp.headers, from, to)?;
            land(&mut resp.body, region, dst, to - from).await
        })
        .await
    }
}

/// Refuses an object whose ETag is not `want` (quotes and a weak prefix
/// aside, as S3 compares them).
pub(super) fn check_if_match(want: Option<&str>, etag: &str) -> Result<(), S3Error> {
    let bare = |e: &str| e.trim().trim_start_matches("W/").trim_matches('"').to_owned();
    match want {
        Some(w) if bare(w) != bare(etag) || etag.is_empty() => Err(S3Error::PreconditionFailed(format!(
            "the object is at ETag {etag:?}, not {w:?} as asked (it was replaced since); nothing was returned"
        ))),
        _ => Ok(()),
    }
}
