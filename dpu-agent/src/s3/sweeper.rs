//! The sweeper: aborts the multipart uploads no request owns (those the
//! journal in `uploads.rs` says the last run left open, those whose abort
//! failed, those a hung gateway created unseen), and the bucket lifecycle
//! rule that catches what it cannot.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::error::S3Error;
use super::store::ObjectStore;
use super::uploads::{Journal, Suspect};

/// How often uploads nobody completes or aborts any more (left by the
/// last run, or whose abort failed) are aborted again.
const SWEEP_EVERY: Duration = Duration::from_secs(10);
/// How long a suspect key is watched.
const SUSPECT_FOR: Duration = Duration::from_secs(600);
/// How far the store's clock may be behind ours.
const CLOCK_SKEW: Duration = Duration::from_secs(300);

impl ObjectStore {
    /// Aborts an upload a previous run left (through the endpoints in turn,
    /// as any request).
    pub async fn abort_left_upload(&self, key: &str, upload_id: &str) -> Result<(), S3Error> {
        let base = self.next_base();
        self.retrying(|attempt| self.client.abort_upload(self.at(base, attempt, key, "abort-left-upload"), upload_id))
            .await
    }
}

/// What the sweeps remember between them.
#[derive(Default)]
pub struct Sweeper {
    /// Failed aborts, by upload (logged now and then, not every sweep).
    tries: BTreeMap<String, u32>,
    suspects: Vec<Suspect>,
}

/// Sweeps (see [`Sweeper::sweep`]) now and every [`SWEEP_EVERY`], for as
/// long as the agent runs, through the namespaces' `stores`
/// (`tenant/namespace`).
pub async fn sweep_forever(
    journal: Arc<Journal>,
    stores: Vec<(String, Arc<ObjectStore>)>,
    aborted: prometheus::IntCounter,
) {
    let stores: BTreeMap<String, Arc<ObjectStore>> = stores.into_iter().collect();
    let left = journal.abandoned().len();
    if left > 0 {
        tracing::info!(uploads = left, "aborting the multipart uploads the last run left open");
    }
    let mut sweeper = Sweeper::default();
    loop {
        sweeper.sweep(&journal, &stores, &aborted).await;
        tokio::time::sleep(SWEEP_EVERY).await;
    }
}

impl Sweeper {
    /// Aborts the uploads no request owns — those the last run left open,
    /// those whose abort failed since (a store down, an upload a hung
    /// gateway holds), the unknown ones hung gateways created (see
    /// [`Suspect`]) — and ends them in `journal`. Returns how many known
    /// ones are left.
    pub async fn sweep(
        &mut self,
        journal: &Journal,
        stores: &BTreeMap<String, Arc<ObjectStore>>,
        aborted: &prometheus::IntCounter,
    ) -> usize {
        let mut left = 0;
        for e in journal.abandoned() {
            let Some(store) = stores.get(&e.namespace).filter(|s| s.bucket == e.bucket) else {
                tracing::warn!(
                    namespace = e.namespace,
                    bucket = e.bucket,
                    key = e.key,
                    upload = e.upload_id,
                    "a multipart upload left open is in a namespace (or bucket) no longer configured: not \
                     aborted; abort it with an S3 tool or let a lifecycle rule expire it"
                );
                let _ = journal.ended(&e.upload_id);
                continue;
            };
            match store.abort_left_upload(&e.key, &e.upload_id).await {
                Ok(()) => {
                    aborted.inc();
                    self.tries.remove(&e.upload_id);
                    let _ = journal.ended(&e.upload_id);
                    tracing::info!(
                        namespace = e.namespace,
                        key = e.key,
                        upload = e.upload_id,
                        "aborted a multipart upload left open"
                    );
                }
                Err(err) => {
                    left += 1;
                    let n = self.tries.entry(e.upload_id.clone()).or_insert(0);
                    *n += 1;
                    if n.is_power_of_two() {
                        tracing::warn!(namespace = e.namespace, key = e.key, upload = e.upload_id, error = %err,
                            tries = *n, "cannot abort a multipart upload left open; trying again later");
                    }
                }
            }
        }
        self.suspects.extend(journal.take_suspects());
        let mut watched = Vec::new();
        for mut s in std::mem::take(&mut self.suspects) {
            let Some(store) = stores.get(&s.namespace).filter(|st| st.bucket == s.bucket) else { continue };
            store.reap_unknown(&mut s, journal, aborted).await;
            if s.since.elapsed().unwrap_or_default() < SUSPECT_FOR {
                watched.push(s);
            }
        }
        self.suspects = watched;
        left
    }
}

impl ObjectStore {
    /// Aborts the uploads of suspect `s`'s key that a hung gateway created
    /// after the agent gave up on it: started after the request (give or
    /// take the clocks' skew), not open in `journal`, and without parts in
    /// this sweep and the one before.
    async fn reap_unknown(&self, s: &mut Suspect, journal: &Journal, aborted: &prometheus::IntCounter) {
        let base = self.next_base();
        let listed =
            self.retrying(|attempt| self.client.list_uploads(self.at(base, attempt, "", "reap-uploads"), &s.key)).await;
        let listed = match listed {
            Ok(l) => l,
            Err(e) => return tracing::debug!(key = s.key, error = %e, "cannot list the uploads of a suspect key"),
        };
        let after = s.since.checked_sub(CLOCK_SKEW).unwrap_or(SystemTime::UNIX_EPOCH);
        let unknown = listed
            .into_iter()
            .filter(|u| u.key == s.key && u.initiated.is_none_or(|t| t >= after) && !journal.is_open(&u.upload_id));
        for u in unknown {
            let parts = self
                .retrying(|attempt| {
                    self.client.count_parts(self.at(base, attempt, &s.key, "reap-uploads"), &u.upload_id)
                })
                .await;
            match parts {
                // A writer's live upload: it has parts. Not ours to touch.
                Ok(n) if n > 0 => {
                    s.empty_once.remove(&u.upload_id);
                }
                Ok(_) if s.empty_once.contains(&u.upload_id) => {
                    match self.abort_left_upload(&s.key, &u.upload_id).await {
                        Ok(()) => {
                            aborted.inc();
                            tracing::info!(
                                key = s.key,
                                upload = u.upload_id,
                                "aborted an upload a hung gateway created after its request was given up on"
                            );
                        }
                        Err(e) => tracing::debug!(key = s.key, upload = u.upload_id, error = %e, "abort failed"),
                    }
                }
                Ok(_) => {
                    s.empty_once.insert(u.upload_id);
                }
                Err(e) => tracing::debug!(key = s.key, upload = u.upload_id, error = %e, "cannot list its parts"),
            }
        }
    }
}

/// What [`ObjectStore::ensure_abort_rule`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleChange {
    /// The bucket had the rule already (its id): left alone.
    Present,
    /// Added (to the rules already there, kept).
    Added,
}

impl ObjectStore {
    /// The id of this namespace's rule: one per prefix, so namespaces
    /// sharing a bucket each have theirs, and a restart finds its own.
    fn abort_rule_id(&self) -> String {
        let digest = ring::digest::digest(&ring::digest::SHA256, self.prefix.as_bytes());
        format!("sluice-abort-incomplete-uploads-{}", hex::encode(&digest.as_ref()[..6]))
    }

    /// Adds to the namespace's bucket a lifecycle rule aborting multipart
    /// uploads under its prefix `days` after they started, keeping the
    /// bucket's other rules (S3 replaces a bucket's lifecycle whole, so it
    /// is read, added to and written back). A rule with our id is left as
    /// it is (an operator may have changed it).
    pub async fn ensure_abort_rule(&self, days: u32) -> Result<RuleChange, S3Error> {
        let base = self.next_base();
        let now = self.retrying(|attempt| self.client.get_lifecycle(self.at(base, attempt, "", "lifecycle"))).await?;
        let id = self.abort_rule_id();
        if now.as_deref().is_some_and(|x| x.contains(&format!("<ID>{id}</ID>"))) {
            return Ok(RuleChange::Present);
        }
        let xml = with_abort_rule(now.as_deref(), &id, &self.prefix, days)?;
        let xml = &xml;
        self.retrying(|attempt| self.client.put_lifecycle(self.at(base, attempt, "", "lifecycle"), xml.clone()))
            .await?;
        Ok(RuleChange::Added)
    }
}

/// `existing` (a bucket's lifecycle XML, if it has one) with our rule
/// added: in the filter form, or the older rule-level `<Prefix>` form when
/// the rules there use it (S3 refuses a mix).
pub(super) fn with_abort_rule(existing: Option<&str>, id: &str, prefix: &str, days: u32) -> Result<String, S3Error> {
    let escaped = prefix.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
    let legacy = existing.is_some_and(|x| x.contains("<Rule>") && !x.contains("<Filter"));
    let scope = if legacy {
        format!("<Prefix>{escaped}</Prefix>")
    } else {
        format!("<Filter><Prefix>{escaped}</Prefix></Filter>")
    };
    let rule = format!(
        "<Rule><ID>{id}</ID>{scope}<Status>Enabled</Status><AbortIncompleteMultipartUpload>\
         <DaysAfterInitiation>{days}</DaysAfterInitiation></AbortIncompleteMultipartUpload></Rule>"
    );
    match existing {
        None => Ok(format!(
            "<LifecycleConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">{rule}</LifecycleConfiguration>"
        )),
        Some(x) => {
            let end = x.rfind("</LifecycleConfiguration>").ok_or_else(|| {
                S3Error::Protocol("the bucket's lifecycle configuration has no </LifecycleConfiguration>".into())
            })?;
            Ok(format!("{}{rule}{}", &x[..end], &x[end..]))
        }
    }
}
