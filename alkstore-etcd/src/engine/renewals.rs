//! Renewals in batches (`Engine::renew_batch`): every lease of a batch
//! refreshed on one keep-alive stream, then every grant checked in one
//! read-only transaction — two round trips for the batch, not two per
//! grant (100 grants to a stream and to a read, side by side).
//!
//! Only a grant renewed as [`EtcdEngine::renew_on`] would renew it at once
//! goes in the batch: its lease remembered, of the length asked, and no
//! move of its key in doubt. Each step is the lone renewal's, in its
//! order: the lease refreshed first, then the key checked still on it and
//! not retired by a fence raise, so a grant answered true lives a full TTL
//! from the refresh. Any other grant is renewed alone, beside the batch;
//! a grant whose lease answered gone, or whose check failed, answers
//! false, and the core renews it once more alone (which reads the key
//! again, as a lone renewal does when its key moved).

use std::collections::HashSet;
use std::sync::Arc;

use alkstore_core::{BoxError, GrantKey, LeaseMillis};

use super::{EtcdEngine, Leased, renewable};
use crate::client::{self, Txn};

/// The most leases one keep-alive stream refreshes (etcd renews them one
/// after another; streams go side by side).
const LEASES_PER_STREAM: usize = 100;

/// The most grants one read checks: one key each and the fence base, under
/// etcd's default `--max-txn-ops` (128).
const CHECKS_PER_READ: usize = 100;

impl EtcdEngine {
    /// Renews each grant of `batch` as [`alkstore_core::Engine::renew`]
    /// would, answering each in `batch`'s order.
    pub(super) async fn renew_each(
        &self,
        batch: &[(GrantKey, LeaseMillis)],
    ) -> Vec<Result<bool, BoxError>> {
        let (together, alone): (Vec<_>, Vec<_>) = batch
            .iter()
            .enumerate()
            .map(|(at, (grant, ttl))| (at, self.batchable(grant, *ttl)))
            .partition(|(_, leased)| leased.is_some());
        let together: Vec<(usize, Leased)> = together
            .into_iter()
            .filter_map(|(at, leased)| Some((at, leased?)))
            .collect();
        let lone = futures::future::join_all(alone.iter().map(|&(at, _)| {
            let (grant, ttl) = &batch[at];
            alkstore_core::Engine::renew(self, grant, *ttl)
        }));
        let (lone, renewed) = futures::future::join(lone, self.renew_together(&together)).await;
        let mut answers: Vec<Option<Result<bool, BoxError>>> = batch.iter().map(|_| None).collect();
        for (&(at, _), answer) in alone.iter().zip(lone) {
            answers[at] = Some(answer);
        }
        match renewed {
            Ok(renewed) => {
                for ((at, leased), renewed) in together.iter().zip(renewed) {
                    if renewed {
                        self.refresh(&batch[*at].0, leased);
                    }
                    answers[*at] = Some(Ok(renewed));
                }
            }
            Err(error) => {
                let error = Arc::new(BatchFailed(error));
                for (at, _) in &together {
                    answers[*at] = Some(Err(Box::new(Shared(error.clone()))));
                }
            }
        }
        answers
            .into_iter()
            .map(|a| a.unwrap_or_else(|| Err("no answer for this renewal".into())))
            .collect()
    }

    /// The lease `grant` is remembered on, when a renewal for `ttl` would
    /// only refresh it and check the key (see the module's comment).
    fn batchable(&self, grant: &GrantKey, ttl: LeaseMillis) -> Option<Leased> {
        if renewable(ttl).is_err() || self.is_unsettled(&grant.name, grant.fence) {
            return None;
        }
        let leased = self.remembered(grant)?;
        (leased.ttl == self.granted_seconds(ttl)).then_some(leased)
    }

    /// Refreshes every lease of `together` (each once), then checks each
    /// grant whose lease is still there: whether each was renewed, in
    /// order.
    async fn renew_together(&self, together: &[(usize, Leased)]) -> Result<Vec<bool>, BoxError> {
        if together.is_empty() {
            return Ok(Vec::new());
        }
        let mut seen = HashSet::new();
        let leases: Vec<i64> = together
            .iter()
            .map(|(_, leased)| leased.lease)
            .filter(|lease| seen.insert(*lease))
            .collect();
        let refreshed = futures::future::try_join_all(
            leases
                .chunks(LEASES_PER_STREAM)
                .map(|chunk| self.client.lease_keep_alive_many(chunk)),
        )
        .await?;
        let alive = |leased: &Leased| {
            refreshed
                .iter()
                .any(|left| left.get(&leased.lease).is_some_and(|ttl| *ttl > 0))
        };
        let checked: Vec<&Leased> = together
            .iter()
            .map(|(_, leased)| leased)
            .filter(|leased| alive(leased))
            .collect();
        let chunks = checked.chunks(CHECKS_PER_READ);
        let holds = futures::future::try_join_all(chunks.map(|chunk| self.check(chunk))).await?;
        let mut holds = holds.into_iter().flatten();
        Ok(together
            .iter()
            .map(|(_, leased)| alive(leased) && holds.next().unwrap_or(false))
            .collect())
    }

    /// Whether each grant of `chunk` is still on its lease and not retired
    /// by a fence raise since it was granted — the lone renewal's compares
    /// ([`EtcdEngine::still_on`]), read instead: one read-only transaction
    /// (served without a Raft write) of the fence base and each key, all at
    /// one revision. A cluster that refuses so many operations in one
    /// transaction (`--max-txn-ops` set below the default) answers false
    /// for each: the core renews each alone.
    async fn check(&self, chunk: &[&Leased]) -> Result<Vec<bool>, BoxError> {
        let txn = chunk.iter().fold(
            Txn::new().read(self.layout.base(), Vec::new()),
            |txn, leased| txn.read(leased.key.clone(), Vec::new()),
        );
        let answer = match self.client.txn(txn).await {
            Ok(answer) => answer,
            Err(status) if status.message().contains("too many operations") => {
                return Ok(vec![false; chunk.len()]);
            }
            Err(status) => return Err(status.into()),
        };
        let mut reads = client::reads(answer).into_iter();
        let base_revision = reads
            .next()
            .and_then(|base| base.kvs.first().map(|kv| kv.mod_revision))
            .unwrap_or(0);
        let holds: Vec<bool> = chunk
            .iter()
            .zip(reads.by_ref())
            .map(|(leased, read)| {
                let on_its_lease = read
                    .kvs
                    .first()
                    .is_some_and(|kv| kv.key == leased.key && kv.lease == leased.lease);
                on_its_lease && base_revision < leased.fence_revision.saturating_add(1)
            })
            .collect();
        if holds.len() != chunk.len() {
            return Err(format!(
                "etcd answered {} reads of {} asked",
                holds.len(),
                chunk.len()
            )
            .into());
        }
        Ok(holds)
    }
}

/// The batch's keep-alive stream or check failed: none of its grants is
/// known renewed or not. The cause is its source.
#[derive(Debug, thiserror::Error)]
#[error("the keep-alive stream or the check of a batch of renewals failed")]
struct BatchFailed(#[source] BoxError);

/// One [`BatchFailed`], the answer of each grant it held.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
struct Shared(Arc<BatchFailed>);
