//! Renewals sent together: on an engine that renews a batch in one round
//! trip ([`Engine::batches_renewals`]), what a store's handles ask for
//! within one beat goes in one [`Engine::renew_batch`], so that ten
//! thousand kept leases cost a few round trips a second rather than one
//! each. On other engines each renewal goes alone, as it is asked.
//!
//! The first renewal after a quiet beat goes at once; the ones that follow
//! within a beat ([`RENEWAL_BEAT`], or the engine's) of a batch wait for
//! the next one (a short lease less: [`window`]). Each member still gets
//! its own answer, and its grant's deadline is measured from when its
//! batch was sent.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, oneshot};
use tracing::Instrument;
use tracing::instrument::WithSubscriber;

use crate::clock::valid_until;
use crate::duration::LeaseMillis;
use crate::engine::{Engine, GrantKey};
use crate::engine_store::Shared;
use crate::error::{BoxError, Closed};
use crate::finish::run_to_end;
use crate::grant::{self, Renewal, SharedGrant};

/// The shortest time between two batches of one store's renewals, unless
/// its engine asks for another ([`Engine::renewal_beat`]): at most 20
/// batches a second, however many leases it keeps.
pub const RENEWAL_BEAT: Duration = Duration::from_millis(50);

/// The most renewals one batch carries: a batch holds the engine (SQLite's
/// one connection, a row lock per grant) while it runs.
const MAX_BATCH: usize = 500;

/// How long a renewal asking for `ttl` may wait for its batch: a beat, or
/// an eighth of a lease shorter than eight beats.
fn window(beat: Duration, ttl: Duration) -> Duration {
    beat.min(ttl / 8)
}

/// One renewal waiting for its batch.
struct Asked {
    key: GrantKey,
    ttl: LeaseMillis,
    state: SharedGrant,
    send_by: Instant,
    answer: oneshot::Sender<Result<bool, BoxError>>,
}

/// The renewals one store's handles asked for and not yet sent.
#[derive(Default)]
pub(crate) struct Renewals {
    /// Each renewal goes alone even on an engine that batches
    /// ([`crate::EngineStore::renewals_in_batches`]).
    pub(crate) alone: std::sync::atomic::AtomicBool,
    queue: Mutex<Queue>,
    /// A renewal joined the queue (its window may end before the beat).
    joined: Notify,
}

impl std::fmt::Debug for Renewals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Renewals")
            .field("waiting", &self.queue().asked.len())
            .finish()
    }
}

#[derive(Default)]
struct Queue {
    asked: Vec<Asked>,
    /// When the last batch was sent.
    last_sent: Option<Instant>,
    /// Whether a task is timing the next batch.
    timing: bool,
}

impl Renewals {
    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Renews `key` for `ttl` and answers as [`Engine::renew`] would; `state`
/// learns when it was sent and what it answered. The renewal runs to its
/// end, and records its answer, even if this future is dropped: a renewal
/// given up on may still land, and until its answer is known the grant's
/// deadline cannot go up.
pub(crate) async fn renew<E: Engine>(
    shared: &Arc<Shared<E>>,
    key: GrantKey,
    ttl: LeaseMillis,
    state: SharedGrant,
) -> Result<bool, BoxError> {
    // Batches need a runtime to time them; without one, on an engine that
    // cannot batch, or told to, the renewal goes alone.
    if !shared.engine.batches_renewals()
        || shared
            .renewals
            .alone
            .load(std::sync::atomic::Ordering::Relaxed)
        || tokio::runtime::Handle::try_current().is_err()
    {
        let shared = shared.clone();
        return run_to_end(async move {
            let sent = Instant::now();
            grant::renewal_sent(&state, valid_until(sent, ttl.as_duration()));
            let answer = shared.engine.renew(&key, ttl).await;
            grant::renewal_answered(&state, outcome(&answer, sent));
            answer
        })
        .await;
    }
    let (answer, answered) = oneshot::channel();
    let send_by = Instant::now() + window(shared.engine.renewal_beat(), ttl.as_duration());
    let start_timing = {
        let mut queue = shared.renewals.queue();
        queue.asked.push(Asked {
            key,
            ttl,
            state,
            send_by,
            answer,
        });
        !std::mem::replace(&mut queue.timing, true)
    };
    if start_timing {
        // The batches' spans go where this call's go.
        tokio::spawn(time_batches(shared.clone()).with_current_subscriber());
    } else {
        shared.renewals.joined.notify_one();
    }
    answered
        .await
        .unwrap_or_else(|_| Err("the renewal's batch ended without an answer".into()))
}

/// What a renewal's answer means for its grant's deadline.
fn outcome(answer: &Result<bool, BoxError>, sent: Instant) -> Renewal {
    match answer {
        Ok(true) => Renewal::Renewed,
        Ok(false) => Renewal::Lost { sent },
        Err(_) => Renewal::Unknown,
    }
}

/// Sends batches while renewals wait: each when its first member's window
/// ends or a beat after the last one, whichever is sooner.
async fn time_batches<E: Engine>(shared: Arc<Shared<E>>) {
    // Should this task end any other way than by finding the queue empty
    // (its runtime shut down, a timer it could not set), the renewals left
    // are answered (none was sent) and the next one starts a new timer.
    let mut timing = Timing {
        renewals: &shared.renewals,
        done: false,
    };
    loop {
        let send_at = {
            let mut queue = shared.renewals.queue();
            let Some(first) = queue.asked.iter().map(|a| a.send_by).min() else {
                queue.timing = false;
                timing.done = true;
                return;
            };
            // The first batch of a store goes at once, as the first after a
            // quiet beat does.
            let next_beat = queue
                .last_sent
                .map_or_else(Instant::now, |sent| sent + shared.engine.renewal_beat());
            let send_at = next_beat.min(first);
            if send_at <= Instant::now() {
                queue.last_sent = Some(Instant::now());
                let take = queue.asked.len().min(MAX_BATCH);
                let batch: Vec<Asked> = queue.asked.drain(..take).collect();
                // Batches may overlap: one slow answer holds up no other.
                tokio::spawn(send(shared.clone(), batch).with_current_subscriber());
                continue;
            }
            send_at
        };
        tokio::select! {
            () = tokio::time::sleep_until(send_at.into()) => {}
            () = shared.renewals.joined.notified() => {}
        }
    }
}

/// The timer's watch over its queue (see [`time_batches`]).
struct Timing<'a> {
    renewals: &'a Renewals,
    done: bool,
}

impl Drop for Timing<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut queue = self.renewals.queue();
        queue.timing = false;
        for asked in queue.asked.drain(..) {
            let _ = asked.answer.send(Err(
                "the renewals' timer stopped before sending this one".into()
            ));
        }
    }
}

/// Sends one batch and hands each member its answer, in an
/// `alkstore.renew_batch` span (`size`: how many renewals it carried).
async fn send<E: Engine>(shared: Arc<Shared<E>>, batch: Vec<Asked>) {
    let span = tracing::debug_span!("alkstore.renew_batch", size = batch.len());
    send_batch(shared, batch).instrument(span).await;
}

async fn send_batch<E: Engine>(shared: Arc<Shared<E>>, batch: Vec<Asked>) {
    if shared.check_open("renew").is_err() {
        for asked in batch {
            let _ = asked.answer.send(Err(Closed.into()));
        }
        return;
    }
    let sent = Instant::now();
    for asked in &batch {
        grant::renewal_sent(&asked.state, valid_until(sent, asked.ttl.as_duration()));
    }
    // Should this task end before the answer (its runtime shut down, the
    // engine panicked), each renewal is recorded unknown: it may have
    // landed, and its grant's deadline must not stay stuck.
    let mut in_flight = InFlight(Some(batch));
    let grants: Vec<(GrantKey, LeaseMillis)> = in_flight
        .members()
        .iter()
        .map(|a| (a.key.clone(), a.ttl))
        .collect();
    let answered = shared.engine.renew_batch(&grants).await;
    let batch = in_flight.0.take().unwrap_or_default();
    let answers: Vec<Result<bool, BoxError>> = match answered {
        Ok(answers) if answers.len() == batch.len() => answers,
        Ok(answers) => {
            let wrong = format!(
                "the engine answered {} renewals of a batch of {}",
                answers.len(),
                batch.len()
            );
            (0..batch.len())
                .map(|_| Err(wrong.clone().into()))
                .collect()
        }
        Err(error) => {
            let shared_error = BatchError(Arc::from(error));
            (0..batch.len())
                .map(|_| Err(shared_error.clone().into()))
                .collect()
        }
    };
    for (asked, answer) in batch.into_iter().zip(answers) {
        if matches!(answer, Ok(false)) {
            // Not renewed in the batch, perhaps only because its row was
            // busy: once more alone, its answer final; the others are
            // answered now.
            tokio::spawn(confirm_alone(shared.clone(), asked).with_current_subscriber());
            continue;
        }
        grant::renewal_answered(&asked.state, outcome(&answer, sent));
        let _ = asked.answer.send(answer);
    }
}

/// Renews a batch's member that the batch did not renew, alone; still in
/// flight for its grant (sent with the batch) until this answers.
async fn confirm_alone<E: Engine>(shared: Arc<Shared<E>>, asked: Asked) {
    let mut in_flight = InFlight(Some(vec![asked]));
    let sent = Instant::now();
    let answer = match in_flight.members().first() {
        Some(asked) => shared.engine.renew(&asked.key, asked.ttl).await,
        None => return,
    };
    if let Some(asked) = in_flight.0.take().and_then(|mut one| one.pop()) {
        grant::renewal_answered(&asked.state, outcome(&answer, sent));
        let _ = asked.answer.send(answer);
    }
}

/// A batch sent and not yet answered (see [`send_batch`]).
struct InFlight(Option<Vec<Asked>>);

impl InFlight {
    fn members(&self) -> &[Asked] {
        self.0.as_deref().unwrap_or_default()
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        for asked in self.0.take().unwrap_or_default() {
            grant::renewal_answered(&asked.state, Renewal::Unknown);
            let _ = asked
                .answer
                .send(Err("the renewal's batch ended before its answer".into()));
        }
    }
}

/// A batch's error, the answer of each of its members: none of them is
/// known to have been renewed or not. The cause is its source.
#[derive(Debug, Clone)]
struct BatchError(Arc<dyn std::error::Error + Send + Sync>);

impl std::fmt::Display for BatchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the batch of renewals failed")
    }
}

impl std::error::Error for BatchError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_lease_waits_less_than_a_beat() {
        assert_eq!(window(RENEWAL_BEAT, Duration::from_secs(30)), RENEWAL_BEAT);
        assert_eq!(
            window(RENEWAL_BEAT, Duration::from_millis(200)),
            Duration::from_millis(25)
        );
    }
}
