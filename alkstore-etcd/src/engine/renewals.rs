//! Renewals in batches (`Engine::renew_batch`): every lease of a batch
//! refreshed on one keep-alive stream, then every grant checked in one
//! transaction — two round trips for the batch, not two per grant.
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

use super::{EtcdEngine, Leased, MAX_LEASE_SECONDS};
use crate::client::{self, Txn};

/// etcd's default `--max-txn-ops`: the most operations one transaction
/// carries (one nested check per grant), and the most leases one
/// keep-alive stream refreshes (etcd renews them one after another).
const MAX_TXN_OPS: usize = 128;

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
        let asked = i64::try_from(ttl.get().div_ceil(1000)).unwrap_or(i64::MAX);
        if asked > MAX_LEASE_SECONDS || self.is_unsettled(&grant.name, grant.fence) {
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
                .chunks(MAX_TXN_OPS)
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
        let answers = futures::future::try_join_all(checked.chunks(MAX_TXN_OPS).map(|chunk| {
            let txn = chunk
                .iter()
                .fold(Txn::new(), |txn, leased| txn.then_if(self.still_on(leased)));
            self.client.txn(txn)
        }))
        .await?;
        let holds: Vec<bool> = answers.iter().flat_map(client::nested_succeeded).collect();
        if holds.len() != checked.len() {
            return Err(format!(
                "etcd answered {} checks of {} asked",
                holds.len(),
                checked.len()
            )
            .into());
        }
        let mut holds = holds.into_iter();
        Ok(together
            .iter()
            .map(|(_, leased)| alive(leased) && holds.next().unwrap_or(false))
            .collect())
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
