//! One engine for every sqlx database: the row operations of
//! [`Engine`](alkstore_core::Engine) over a dialect's [`Statements`].
//!
//! What is the same whatever the database lives here once: which statement
//! may run again after a lost connection, how a waiting acquire that ran out
//! of time answers, how a removal tried twice answers ([`removed`]), how
//! rows become holders. What differs lives in the dialect's crate, in the
//! one file that composes its SQL: per operation, the statement with its
//! binds and how its answer reads ([`Statements`]), and how releases in
//! other processes reach waiters ([`Wakeups`]).

use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, Instant};

use alkstore_core::{
    Access, Attempt, BoxError, Engine, GrantKey, HeldAs, Holder, LeaseMillis, Listed,
    PermitAttempt, Queue, Queued, ReleaseBus, RwAttempt, RwMode, TicketKind, Waiter,
    fence_from_sql, fence_to_sql, holder_from_sql, lease_left, permits_row_kind,
};
use async_trait::async_trait;

use crate::{
    Conn, Connections, Dialect, LostFencesError, Namespace, OnLostConnection, Setup,
    StatementFuture, removed,
};

/// A holder's row: owner, fence, lease left in milliseconds.
pub type HolderRow = (String, i64, i64);

/// A listed row: name, owner, fence, lease left in milliseconds, and for a
/// semaphore's permit its slot and the semaphore's permits (`None` for a
/// lock's grant).
pub type ListedRow = (String, String, i64, i64, Option<i32>, Option<i32>);

/// An acquire's answer: granted, fence, lease left in milliseconds (of the
/// grant, or of the live holder; `None` for a refusal in turn, with nobody
/// holding), when live permits of a semaphore hold the name their permits
/// (then nothing was granted or written), and the [`QueueColumns`].
pub type AcquireRow = (
    bool,
    i64,
    Option<i64>,
    Option<i32>,
    Option<i64>,
    Option<i32>,
    Option<i64>,
);

/// Where a refused waiting call stands, the last three columns of every
/// acquire's answer: its ticket, its position, and the ticket ahead whose
/// leaving is its cue ([`Queued`]). The first two are `None` when the call
/// was not queued (a `try_` call, a grant, or a dialect that does not
/// queue).
pub type QueueColumns = (Option<i64>, Option<i32>, Option<i64>);

/// A waiter's row, as [`Statements::waiters`] answers it: ticket, owner,
/// kind ([`TicketKind::as_str`]), ticket lease left in milliseconds, and
/// how long it has waited in milliseconds.
pub type WaiterRow = (i64, String, String, i64, i64);

/// A permit acquire's answer: the outcome (one of [`PermitOutcome`]'s
/// texts), fence, slot, lease left in milliseconds (of the grant, or of the
/// live permit that ends first; `None` when none holds), the live grants'
/// permits (for a mismatch), and the [`QueueColumns`].
pub type PermitRow = (
    String,
    i64,
    i32,
    Option<i64>,
    i32,
    Option<i64>,
    Option<i32>,
    Option<i64>,
);

/// A reader-writer acquire's answer: the outcome (one of
/// [`PermitOutcome`]'s texts: granted, held, lock or semaphore), fence,
/// slot (the grant's row slot: a reader's, or
/// [`WRITER_SLOT`](alkstore_core::WRITER_SLOT)), lease left in
/// milliseconds (of the grant, or of what refused it that ends first;
/// `None` when nothing holds), a semaphore's permits (when one holds the
/// name), and the [`QueueColumns`]: a [`PermitRow`]'s columns.
pub type RwRow = PermitRow;

/// The outcomes a permit or reader-writer acquire's statement answers, as
/// text.
pub struct PermitOutcome;

impl PermitOutcome {
    /// A grant was made (or the owner's live one given back).
    pub const GRANTED: &'static str = "granted";
    /// Every permit is held by someone else; or, for a reader-writer
    /// acquire, what it asked for is held.
    pub const HELD: &'static str = "held";
    /// Live grants of the name have another number of permits (permits 0:
    /// a reader-writer lock's).
    pub const MISMATCH: &'static str = "mismatch";
    /// A live lock holds the name.
    pub const HELD_AS_LOCK: &'static str = "lock";
    /// A semaphore's live permits hold the name (a reader-writer acquire's
    /// answer).
    pub const HELD_AS_SEMAPHORE: &'static str = "semaphore";
}

/// One store's statements in one dialect: per operation, the statement with
/// its binds, in parameter order next to its SQL, and how its answer is
/// read. Each runs on the connection it is given and is one round trip
/// (MariaDB's `raise_fences` excepted: two, on the one connection).
pub trait Statements: Debug + Send + Sync + 'static {
    /// The database the statements are written for.
    type Dialect: Dialect;

    /// What to run on each new connection of the store ([`Setup`]). The
    /// default: nothing.
    fn setup(&self) -> Option<Setup<Self::Dialect>> {
        None
    }

    /// Whether the statements keep queues ([`Engine::queues`]): then every
    /// acquire takes its [`Queue`] standing into account, and
    /// [`Statements::leave_queue`] and [`Statements::waiters`] are
    /// written. The default: no.
    fn queues(&self) -> bool {
        false
    }

    /// Grants `name` to `owner` for `ttl` unless someone else's live lease
    /// holds it (or, where the dialect queues, a waiter's turn comes
    /// first); `queue` is the attempt's standing; `bound`, for a waiting
    /// acquire, is when its lock waits end. Answers an [`AcquireRow`]; no
    /// row is an error.
    fn acquire<'c>(
        &self,
        conn: &'c mut Conn<Self::Dialect>,
        name: &str,
        owner: &str,
        ttl: LeaseMillis,
        queue: Queue,
        bound: Option<Instant>,
    ) -> StatementFuture<'c, Option<AcquireRow>>;

    /// A permit of the semaphore `name` of `permits` permits for `owner`,
    /// by the rules of [`Engine::acquire_permit`]; `queue` and `bound` as
    /// for [`Statements::acquire`]. Answers a [`PermitRow`]; no row is an
    /// error. The default: the dialect has no semaphores
    /// ([`PermitsUnsupported`](alkstore_core::PermitsUnsupported)).
    #[allow(clippy::too_many_arguments)]
    fn acquire_permit<'c>(
        &self,
        conn: &'c mut Conn<Self::Dialect>,
        name: &str,
        permits: u32,
        owner: &str,
        ttl: LeaseMillis,
        queue: Queue,
        bound: Option<Instant>,
    ) -> StatementFuture<'c, Option<PermitRow>> {
        let _ = (conn, name, permits, owner, ttl, queue, bound);
        Box::pin(async {
            Err(sqlx::Error::Configuration(
                alkstore_core::PermitsUnsupported.into(),
            ))
        })
    }

    /// A reader-writer lock's grant of `name` for `owner`, by the rules of
    /// [`Engine::acquire_rw`] (a dialect that does not queue records a
    /// waiting writer's intent, [`Queue::lease`], on a refusal); `queue`
    /// and `bound` as for [`Statements::acquire`]. Answers an [`RwRow`];
    /// no row is an error. The default: the dialect has no reader-writer
    /// locks ([`RwUnsupported`](alkstore_core::RwUnsupported)).
    #[allow(clippy::too_many_arguments)]
    fn acquire_rw<'c>(
        &self,
        conn: &'c mut Conn<Self::Dialect>,
        name: &str,
        mode: RwMode,
        owner: &str,
        ttl: LeaseMillis,
        queue: Queue,
        bound: Option<Instant>,
    ) -> StatementFuture<'c, Option<RwRow>> {
        let _ = (conn, name, mode, owner, ttl, queue, bound);
        Box::pin(async {
            Err(sqlx::Error::Configuration(
                alkstore_core::RwUnsupported.into(),
            ))
        })
    }

    /// Removes `ticket` from `name`'s queue, cueing the waiter behind it
    /// where the database can tell other processes; answers the rows it
    /// removed. The default (a dialect that does not queue): none.
    fn leave_queue<'c>(
        &self,
        conn: &'c mut Conn<Self::Dialect>,
        name: &str,
        ticket: i64,
    ) -> StatementFuture<'c, u64> {
        let _ = (conn, name, ticket);
        Box::pin(async { Ok(0) })
    }

    /// The live tickets of `name`, oldest first. The default (a dialect
    /// that does not queue): none.
    fn waiters<'c>(
        &self,
        conn: &'c mut Conn<Self::Dialect>,
        name: &str,
    ) -> StatementFuture<'c, Vec<WaiterRow>> {
        let _ = (conn, name);
        Box::pin(async { Ok(Vec::new()) })
    }

    /// Extends the live grant (a lock's, or one in the permits table:
    /// [`GrantKey::row_slot`])
    /// to `ttl` from now; answers the rows it matched (1, or 0 when the
    /// grant is gone).
    fn renew<'c>(
        &self,
        conn: &'c mut Conn<Self::Dialect>,
        grant: &GrantKey,
        ttl: LeaseMillis,
    ) -> StatementFuture<'c, u64>;

    /// Whether [`Statements::renew_batch`] renews a batch in one
    /// statement (the default: no).
    fn batches_renewals(&self) -> bool {
        false
    }

    /// Extends each live grant of `batch` (no row twice) to its ttl from
    /// now, in one statement; answers the positions in `batch` of the
    /// grants it renewed. It may leave out a grant whose row another
    /// transaction holds rather than wait for it: the core renews each one
    /// it left out alone. Called only when [`Statements::batches_renewals`].
    fn renew_batch<'c>(
        &self,
        conn: &'c mut Conn<Self::Dialect>,
        batch: &[(GrantKey, LeaseMillis)],
    ) -> StatementFuture<'c, Vec<usize>> {
        let _ = (conn, batch);
        Box::pin(async { Err(sqlx::Error::Protocol("no batched renewal".into())) })
    }

    /// Removes the grant (waking waiters, where the database can tell other
    /// processes); answers the rows it removed.
    fn release<'c>(
        &self,
        conn: &'c mut Conn<Self::Dialect>,
        grant: &GrantKey,
    ) -> StatementFuture<'c, u64>;

    /// The live holder of `name`.
    fn holder<'c>(
        &self,
        conn: &'c mut Conn<Self::Dialect>,
        name: &str,
    ) -> StatementFuture<'c, Option<HolderRow>>;

    /// Live grants whose names start with `prefix`, after `after` in byte
    /// order (`""` from the first): the first `limit` in name and slot
    /// order, and every live permit of the last one's name.
    fn list<'c>(
        &self,
        conn: &'c mut Conn<Self::Dialect>,
        prefix: &str,
        after: &str,
        limit: i64,
    ) -> StatementFuture<'c, Vec<ListedRow>>;

    /// Removes the live lock of `name`, or with `fence` the live grant of
    /// that fence (a lock's or a permit's), durably, waking waiters;
    /// answers what it removed.
    fn force_release<'c>(
        &self,
        conn: &'c mut Conn<Self::Dialect>,
        name: &str,
        fence: Option<i64>,
    ) -> StatementFuture<'c, Option<HolderRow>>;

    /// Deletes expired rows, locks' and permits'; answers how many.
    fn purge<'c>(&self, conn: &'c mut Conn<Self::Dialect>) -> StatementFuture<'c, u64>;

    /// Raises the fences by at least `by`, durably; answers the lowest
    /// fence a later grant can get.
    fn raise_fences<'c>(
        &self,
        conn: &'c mut Conn<Self::Dialect>,
        by: i64,
    ) -> StatementFuture<'c, i64>;
}

/// How waiters of one store hear of releases made by other processes.
#[async_trait]
pub trait Wakeups: Debug + Send + Sync + 'static {
    /// The longest a waiter sleeps between attempts when no wake-up comes.
    fn poll_ceiling(&self) -> Duration;

    /// The longest the first two in a name's queue sleep between attempts
    /// ([`Engine::turn_poll_ceiling`]). The default: the poll ceiling.
    fn turn_poll_ceiling(&self) -> Duration {
        self.poll_ceiling()
    }

    /// Starts carrying other processes' releases to `bus`, once, before the
    /// first wait (PostgreSQL's LISTEN). The default: nothing to start.
    async fn prepare(&self, bus: &Arc<ReleaseBus>) -> Result<(), BoxError> {
        let _ = bus;
        Ok(())
    }

    /// Stops, when the store closes.
    async fn close(&self) {}
}

/// A database that cannot tell other processes of a release: their waiters
/// poll, every this long at most (releases in this process wake at once);
/// the first two in a name's queue every [`TURN_POLL_CEILING`] at most.
#[derive(Debug, Clone, Copy)]
pub struct Polling(pub Duration);

/// How often the first two waiters in a name's queue poll at least, where
/// no release is heard across processes: 10 ms, two waiters per name.
pub const TURN_POLL_CEILING: Duration = Duration::from_millis(10);

#[async_trait]
impl Wakeups for Polling {
    fn poll_ceiling(&self) -> Duration {
        self.0
    }

    fn turn_poll_ceiling(&self) -> Duration {
        TURN_POLL_CEILING.min(self.0)
    }
}

/// The engine every sqlx database shares.
#[derive(Debug)]
pub struct SqlxEngine<S: Statements> {
    namespace: Namespace,
    pool: sqlx::Pool<<S::Dialect as Dialect>::Database>,
    connections: Connections<S::Dialect>,
    statements: S,
    wakeups: Box<dyn Wakeups>,
    bus: Arc<ReleaseBus>,
}

impl<S: Statements> SqlxEngine<S> {
    /// An engine for the store opened in `namespace` over `pool`: its lock
    /// operations run on connections of its own, as many as the pool may
    /// have, made with the pool's options and the dialect's
    /// [`store_options`](Dialect::store_options).
    pub fn new(
        namespace: Namespace,
        pool: sqlx::Pool<<S::Dialect as Dialect>::Database>,
        statements: S,
        wakeups: Box<dyn Wakeups>,
    ) -> Self {
        let mut connections = Connections::new(
            S::Dialect::store_options(&pool.connect_options()),
            pool.options().get_max_connections(),
        );
        if let Some(setup) = statements.setup() {
            connections = connections.with_setup(setup);
        }
        SqlxEngine {
            namespace,
            pool,
            connections,
            statements,
            wakeups,
            bus: Arc::new(ReleaseBus::new()),
        }
    }

    /// With statements unanswered `within` past their lock waits failing
    /// ([`Connections::with_answer_bound`]), naming `via` when given.
    pub fn with_answer_bound(mut self, within: Duration, via: Option<String>) -> Self {
        self.connections = self.connections.with_answer_bound(within, via);
        self
    }

    /// Where the store's objects live.
    pub fn namespace(&self) -> &Namespace {
        &self.namespace
    }

    /// The pool the store was opened over.
    pub fn pool(&self) -> &sqlx::Pool<<S::Dialect as Dialect>::Database> {
        &self.pool
    }

    /// The store's statements.
    pub fn statements(&self) -> &S {
        &self.statements
    }

    /// The bus releases are signalled on (for a dialect's [`Wakeups`]).
    pub fn bus(&self) -> &Arc<ReleaseBus> {
        &self.bus
    }
}

impl<S: Statements> SqlxEngine<S> {
    /// An acquire statement's answer: its row, `None` when a waiting
    /// acquire ran out of time (a refusal), or the error (a lost `fences`
    /// sequence named as such).
    fn answered<T>(
        &self,
        row: Result<Option<T>, BoxError>,
        deadline: Option<Instant>,
    ) -> Result<Option<T>, BoxError> {
        match row {
            Ok(Some(row)) => Ok(Some(row)),
            Ok(None) => Err("the acquire statement returned no row".into()),
            Err(error) if deadline.is_some() && crate::ran_out_of_time::<S::Dialect>(&error) => {
                Ok(None)
            }
            Err(error)
                if error
                    .downcast_ref::<sqlx::Error>()
                    .is_some_and(S::Dialect::no_fence_left) =>
            {
                Err(alkstore_core::NoFenceLeft { left: 0 }.into())
            }
            Err(error)
                if error
                    .downcast_ref::<sqlx::Error>()
                    .is_some_and(S::Dialect::fences_gone) =>
            {
                Err(LostFencesError {
                    namespace: self.namespace.clone(),
                }
                .into())
            }
            Err(error) => Err(error),
        }
    }
}

/// A slot or a count of permits as SQL stores it (`integer`).
fn permits_from_sql(value: i32) -> Result<u32, BoxError> {
    u32::try_from(value).map_err(|_| format!("a permit row holds {value}").into())
}

/// A refusal's [`QueueColumns`] as the core reads them: queued when the
/// statement answered a ticket and a position.
fn queued(columns: QueueColumns) -> Result<Option<Queued>, BoxError> {
    let (Some(ticket), Some(position), cue) = columns else {
        return Ok(None);
    };
    let number = |n: i64| u64::try_from(n).map_err(|_| format!("a queue answered ticket {n}"));
    Ok(Some(Queued {
        ticket: number(ticket)?,
        position: u32::try_from(position).map_err(|_| format!("a queue answered {position}"))?,
        ahead: cue.map(number).transpose()?,
    }))
}

/// Names and owners as the database returned them.
fn holders(row: HolderRow) -> Holder {
    let (owner, fence, left) = row;
    holder_from_sql(owner, fence, left)
}

#[async_trait]
impl<S: Statements> Engine for SqlxEngine<S> {
    async fn acquire(
        &self,
        name: &str,
        owner: &str,
        ttl: LeaseMillis,
        queue: Queue,
        deadline: Option<Instant>,
    ) -> Result<Attempt, BoxError> {
        let row = self
            .connections
            // Run again, the same owner is granted its own grant back (and
            // its ticket is renewed again; a first attempt whose answer was
            // lost drew a ticket it never learns, which lapses with its
            // lease).
            .run(OnLostConnection::RunAgain, deadline, |conn, attempt| {
                self.statements
                    .acquire(conn, name, owner, ttl, queue, attempt.bound)
            })
            .await;
        let Some((granted, fence, left, semaphore, ticket, position, cue)) =
            self.answered(row, deadline)?
        else {
            return Ok(Attempt::Held { expires_in: None });
        };
        Ok(match (granted, semaphore) {
            (_, Some(permits)) => match HeldAs::of_permits_column(permits_from_sql(permits)?) {
                HeldAs::Semaphore { permits } => Attempt::HeldAsSemaphore { permits },
                _ => Attempt::HeldAsReadWrite,
            },
            (true, None) => Attempt::Granted {
                fence: fence_from_sql(fence),
                expires_in: lease_left(left.unwrap_or(0)),
            },
            (false, None) => {
                Attempt::refused(left.map(lease_left), queued((ticket, position, cue))?)
            }
        })
    }

    async fn acquire_permit(
        &self,
        name: &str,
        permits: u32,
        owner: &str,
        ttl: LeaseMillis,
        queue: Queue,
        deadline: Option<Instant>,
    ) -> Result<PermitAttempt, BoxError> {
        let row = self
            .connections
            // Run again, the same owner is granted its own permit back.
            .run(OnLostConnection::RunAgain, deadline, |conn, attempt| {
                self.statements.acquire_permit(
                    conn,
                    name,
                    permits,
                    owner,
                    ttl,
                    queue,
                    attempt.bound,
                )
            })
            .await;
        let Some((outcome, fence, slot, left, live, ticket, position, cue)) =
            self.answered(row, deadline)?
        else {
            return Ok(PermitAttempt::Held { expires_in: None });
        };
        Ok(match outcome.as_str() {
            PermitOutcome::GRANTED => PermitAttempt::Granted {
                fence: fence_from_sql(fence),
                slot: permits_from_sql(slot)?,
                expires_in: lease_left(left.unwrap_or(0)),
            },
            PermitOutcome::HELD => {
                PermitAttempt::refused(left.map(lease_left), queued((ticket, position, cue))?)
            }
            PermitOutcome::MISMATCH => match HeldAs::of_permits_column(permits_from_sql(live)?) {
                HeldAs::Semaphore { permits } => PermitAttempt::Mismatch { permits },
                _ => PermitAttempt::HeldAsReadWrite,
            },
            PermitOutcome::HELD_AS_LOCK => PermitAttempt::HeldAsLock,
            other => return Err(format!("a permit acquire answered {other:?}").into()),
        })
    }

    async fn acquire_rw(
        &self,
        name: &str,
        mode: RwMode,
        owner: &str,
        ttl: LeaseMillis,
        queue: Queue,
        deadline: Option<Instant>,
    ) -> Result<RwAttempt, BoxError> {
        let row = self
            .connections
            // Run again, the same owner is granted its own grant back (and
            // a ticket or intent recorded again is the same one).
            .run(OnLostConnection::RunAgain, deadline, |conn, attempt| {
                self.statements
                    .acquire_rw(conn, name, mode, owner, ttl, queue, attempt.bound)
            })
            .await;
        let Some((outcome, fence, slot, left, permits, ticket, position, cue)) =
            self.answered(row, deadline)?
        else {
            return Ok(RwAttempt::Held { expires_in: None });
        };
        Ok(match outcome.as_str() {
            PermitOutcome::GRANTED => RwAttempt::Granted {
                fence: fence_from_sql(fence),
                access: Access::of_row_slot(i64::from(slot))
                    .ok_or_else(|| format!("a reader-writer grant answered slot {slot}"))?,
                expires_in: lease_left(left.unwrap_or(0)),
            },
            PermitOutcome::HELD => {
                RwAttempt::refused(left.map(lease_left), queued((ticket, position, cue))?)
            }
            PermitOutcome::HELD_AS_LOCK => RwAttempt::HeldAsOther(HeldAs::Lock),
            PermitOutcome::HELD_AS_SEMAPHORE => RwAttempt::HeldAsOther(HeldAs::Semaphore {
                permits: permits_from_sql(permits)?,
            }),
            other => return Err(format!("a reader-writer acquire answered {other:?}").into()),
        })
    }

    fn queues(&self) -> bool {
        self.statements.queues()
    }

    async fn leave_queue(&self, name: &str, ticket: u64) -> Result<bool, BoxError> {
        let Ok(ticket) = i64::try_from(ticket) else {
            // Never drawn here: every ticket this engine hands out fits.
            return Ok(false);
        };
        let left = self
            .connections
            // Run again: removing a ticket twice removes it once.
            .run(OnLostConnection::RunAgain, None, |conn, _| {
                self.statements.leave_queue(conn, name, ticket)
            })
            .await?;
        Ok(left == 1)
    }

    async fn waiters(&self, name: &str) -> Result<Vec<Waiter>, BoxError> {
        let rows = self
            .connections
            .run(OnLostConnection::RunAgain, None, |conn, _| {
                self.statements.waiters(conn, name)
            })
            .await?;
        rows.into_iter()
            .map(|(ticket, owner, kind, left, waited)| {
                Ok(Waiter {
                    owner,
                    ticket: u64::try_from(ticket)
                        .map_err(|_| format!("a waiter holds ticket {ticket}"))?,
                    kind: TicketKind::parse(&kind)
                        .ok_or_else(|| format!("a waiter waits for {kind:?}"))?
                        .as_str(),
                    expires_in: lease_left(left),
                    waited: lease_left(waited),
                })
            })
            .collect()
    }

    async fn renew(&self, grant: &GrantKey, ttl: LeaseMillis) -> Result<bool, BoxError> {
        let matched = self
            .connections
            .run(OnLostConnection::RunAgain, None, |conn, _| {
                self.statements.renew(conn, grant, ttl)
            })
            .await?;
        Ok(matched == 1)
    }

    fn batches_renewals(&self) -> bool {
        self.statements.batches_renewals()
    }

    /// One statement for the batch, each row in it once (two handles of
    /// one grant share its answer).
    async fn renew_batch(
        &self,
        batch: &[(GrantKey, LeaseMillis)],
    ) -> Result<Vec<Result<bool, BoxError>>, BoxError> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        // The grant's row, as the statement matches it.
        let row = |g: &GrantKey| (g.name.clone(), g.row_slot(), g.owner.clone(), g.fence);
        let mut distinct: Vec<(GrantKey, LeaseMillis)> = Vec::with_capacity(batch.len());
        let mut position_of = std::collections::HashMap::new();
        let positions: Vec<usize> = batch
            .iter()
            .map(|(grant, ttl)| {
                let at = *position_of.entry(row(grant)).or_insert_with(|| {
                    distinct.push((grant.clone(), *ttl));
                    distinct.len() - 1
                });
                // Asked twice: the shortest ttl, so that no lease is longer
                // than any of its renewals asked for.
                if ttl.as_i64() < distinct[at].1.as_i64() {
                    distinct[at].1 = *ttl;
                }
                at
            })
            .collect();
        let renewed = self
            .connections
            .run(OnLostConnection::RunAgain, None, |conn, _| {
                self.statements.renew_batch(conn, &distinct)
            })
            .await?;
        let mut answered = vec![false; distinct.len()];
        for at in renewed {
            let slot = answered
                .get_mut(at)
                .ok_or("the batch renewal answered a grant it was not given")?;
            *slot = true;
        }
        Ok(positions.into_iter().map(|at| Ok(answered[at])).collect())
    }

    async fn release(&self, grant: &GrantKey) -> Result<bool, BoxError> {
        let mut after_lost_connection = false;
        let deleted = self
            .connections
            .run(OnLostConnection::RunAgain, None, |conn, attempt| {
                after_lost_connection = attempt.after_lost_connection;
                self.statements.release(conn, grant)
            })
            .await?;
        let removed = removed(
            (deleted == 1).then_some(()),
            after_lost_connection,
            "release",
        )?;
        Ok(removed.is_some())
    }

    async fn holder(&self, name: &str) -> Result<Option<Holder>, BoxError> {
        let row = self
            .connections
            .run(OnLostConnection::RunAgain, None, |conn, _| {
                self.statements.holder(conn, name)
            })
            .await?;
        Ok(row.map(holders))
    }

    async fn list(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Listed>, BoxError> {
        // At most MAX_LIST_LIMIT (validated by the core), so it fits.
        let limit = i64::try_from(limit)?;
        let after = after.unwrap_or("");
        let rows = self
            .connections
            .run(OnLostConnection::RunAgain, None, |conn, _| {
                self.statements.list(conn, prefix, after, limit)
            })
            .await?;
        Ok(rows
            .into_iter()
            .map(|(name, owner, fence, left, slot, permits)| {
                let (permit, access) = match (slot, permits) {
                    (Some(slot), Some(permits)) => {
                        permits_row_kind(i64::from(slot), permits_from_sql(permits)?)
                    }
                    _ => (None, None),
                };
                Ok(Listed {
                    name,
                    holder: holder_from_sql(owner, fence, left),
                    permit,
                    access,
                })
            })
            .collect::<Result<_, BoxError>>()?)
    }

    async fn force_release(
        &self,
        name: &str,
        fence: Option<u64>,
    ) -> Result<Option<Holder>, BoxError> {
        // Of one grant, run again after a lost connection: a second try that
        // removes the grant proves the first did not. Of a name, not: a
        // second try could remove a grant made after the first removed its.
        let on_lost = match fence {
            Some(_) => OnLostConnection::RunAgain,
            None => OnLostConnection::Fail,
        };
        let fence = fence.map(fence_to_sql);
        let mut after_lost_connection = false;
        let row = self
            .connections
            .run(on_lost, None, |conn, attempt| {
                after_lost_connection = attempt.after_lost_connection;
                self.statements.force_release(conn, name, fence)
            })
            .await?;
        Ok(removed(row, after_lost_connection, "forced release")?.map(holders))
    }

    async fn purge_expired(&self) -> Result<u64, BoxError> {
        self.connections
            // Not run again after a lost connection: the first try may have
            // deleted rows, and a second would count fewer.
            .run(OnLostConnection::Fail, None, |conn, _| {
                self.statements.purge(conn)
            })
            .await
    }

    async fn raise_fences(&self, by: u64) -> Result<u64, BoxError> {
        let by = fence_to_sql(by);
        let next = self
            .connections
            // Not run again: a second run would raise twice.
            .run(OnLostConnection::Fail, None, |conn, _| {
                self.statements.raise_fences(conn, by)
            })
            .await?;
        Ok(fence_from_sql(next))
    }

    async fn close(&self) -> Result<(), BoxError> {
        self.wakeups.close().await;
        self.connections.close().await;
        self.pool.close().await;
        Ok(())
    }

    fn releases(&self) -> &ReleaseBus {
        &self.bus
    }

    async fn prepare_wait(&self) -> Result<(), BoxError> {
        self.wakeups.prepare(&self.bus).await
    }

    fn name(&self) -> &'static str {
        S::Dialect::ENGINE
    }

    fn poll_ceiling(&self) -> Duration {
        self.wakeups.poll_ceiling()
    }

    fn turn_poll_ceiling(&self) -> Duration {
        self.wakeups.turn_poll_ceiling()
    }
}
