//! The row operations of the PostgreSQL engine: one statement, one round
//! trip, per operation.

use std::sync::Arc;
use std::time::{Duration, Instant};

use alkstore_core::{
    Attempt, BoxError, Engine, GrantKey, Holder, LeaseMillis, Listed, ReleaseBus, fence_from_sql,
    fence_to_sql, holder_from_sql, lease_left,
};
use async_trait::async_trait;
use sqlx::PgPool;
use tokio::sync::OnceCell;

use alkstore_sqlx::{OnLostConnection, decoded, ran_out_of_time, removed};

use crate::connection::{Connections, Postgres};
use crate::listener::Listener;
use crate::sql::Statements;

/// How long a waiter polls at most when no notification comes (expiries
/// notify nobody, and a notification can be lost while the listener reconnects).
const POLL_CEILING: Duration = Duration::from_millis(250);

#[derive(Debug)]
pub(crate) struct PgEngine {
    pub(crate) pool: PgPool,
    pub(crate) schema: String,
    /// The pool of one connection the release listener uses, so that it
    /// never holds a connection of the caller's pool.
    pub(crate) listen_pool: PgPool,
    pub(crate) connections: Connections,
    pub(crate) sql: Statements,
    pub(crate) channel: String,
    /// This store's mark on the notifications its releases send.
    pub(crate) tag: String,
    pub(crate) bus: Arc<ReleaseBus>,
    pub(crate) listener: OnceCell<Listener>,
}

impl PgEngine {
    /// Drops alkstore's objects, and the schema if alkstore created it and
    /// nothing else lives there.
    pub(crate) async fn drop_schema(&self) -> Result<(), BoxError> {
        crate::schema::drop(&self.pool, &self.schema, &self.sql).await
    }
}

/// The acquire function's bound on lock waits: the wait left, in whole
/// milliseconds (rounded up, so a bound never reads as "no bound").
fn lock_wait_ms(deadline: Instant) -> i32 {
    let left = deadline.saturating_duration_since(Instant::now());
    i32::try_from(left.as_micros().div_ceil(1000)).unwrap_or(i32::MAX)
}

#[async_trait]
impl Engine for PgEngine {
    async fn acquire(
        &self,
        name: &str,
        owner: &str,
        ttl: LeaseMillis,
        deadline: Option<Instant>,
    ) -> Result<Attempt, BoxError> {
        // A waiting acquire bounds every lock wait, the table's included.
        let statement = match deadline {
            Some(_) => &self.sql.acquire_waiting,
            None => &self.sql.acquire,
        };
        let row: Result<Option<(bool, i64, i64)>, BoxError> = self
            .connections
            // Run again, the same owner is granted its own grant back.
            .run(OnLostConnection::RunAgain, deadline, |conn, attempt| {
                Box::pin(
                    sqlx::query(statement.clone())
                        .bind(name)
                        .bind(owner)
                        .bind(ttl.as_i64())
                        .bind(attempt.bound.map(lock_wait_ms))
                        .fetch_optional(conn),
                )
            })
            .await
            .and_then(decoded);
        Ok(match row {
            Ok(Some((true, fence, expires_in_ms))) => Attempt::Granted {
                fence: fence_from_sql(fence),
                expires_in: lease_left(expires_in_ms),
            },
            Ok(Some((false, _, expires_in_ms))) => Attempt::Held {
                expires_in: Some(lease_left(expires_in_ms)),
            },
            // A concurrent grant won the race after our snapshot: held.
            Ok(None) => Attempt::Held { expires_in: None },
            Err(error) if deadline.is_some() && ran_out_of_time::<Postgres>(&error) => {
                Attempt::Held { expires_in: None }
            }
            Err(error) => return Err(error),
        })
    }

    async fn renew(&self, grant: &GrantKey, ttl: LeaseMillis) -> Result<bool, BoxError> {
        let done = self
            .connections
            .run(OnLostConnection::RunAgain, None, |conn, _| {
                Box::pin(
                    sqlx::query(self.sql.renew.clone())
                        .bind(&grant.name)
                        .bind(&grant.owner)
                        .bind(fence_to_sql(grant.fence))
                        .bind(ttl.as_i64())
                        .execute(conn),
                )
            })
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn release(&self, grant: &GrantKey) -> Result<bool, BoxError> {
        let mut after_lost_connection = false;
        let (deleted,): (i64,) = self
            .connections
            .run(OnLostConnection::RunAgain, None, |conn, attempt| {
                after_lost_connection = attempt.after_lost_connection;
                Box::pin(
                    sqlx::query(self.sql.release.clone())
                        .bind(&grant.name)
                        .bind(&grant.owner)
                        .bind(fence_to_sql(grant.fence))
                        .bind(&self.channel)
                        .bind(&self.tag)
                        .fetch_one(conn),
                )
            })
            .await
            .and_then(|row| decoded(Some(row)))?
            .ok_or("the release statement returned no row")?;
        Ok(removed(
            (deleted == 1).then_some(()),
            after_lost_connection,
            "release",
        )?
        .is_some())
    }

    async fn holder(&self, name: &str) -> Result<Option<Holder>, BoxError> {
        let row: Option<(String, i64, i64)> = self
            .connections
            .run(OnLostConnection::RunAgain, None, |conn, _| {
                Box::pin(
                    sqlx::query(self.sql.holder.clone())
                        .bind(name)
                        .fetch_optional(conn),
                )
            })
            .await
            .and_then(decoded)?;
        Ok(row.map(|(owner, fence, left)| holder_from_sql(owner, fence, left)))
    }

    async fn list(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Listed>, BoxError> {
        // At most MAX_LIST_LIMIT (validated by the core), so it fits.
        let limit = i64::try_from(limit)?;
        // Owned: the statement's future outlives no borrowed argument.
        let (prefix, after) = (prefix.to_owned(), after.unwrap_or("").to_owned());
        let rows: Vec<(String, String, i64, i64)> = self
            .connections
            .run(OnLostConnection::RunAgain, None, |conn, _| {
                Box::pin(
                    sqlx::query_as(self.sql.list.clone())
                        .bind(prefix.clone())
                        .bind(after.clone())
                        .bind(limit)
                        .fetch_all(conn),
                )
            })
            .await?;
        Ok(rows
            .into_iter()
            .map(|(name, owner, fence, left)| Listed {
                name,
                holder: holder_from_sql(owner, fence, left),
            })
            .collect())
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
        let row: Option<(String, i64, i64, Option<String>)> = self
            .connections
            .run(on_lost, None, |conn, attempt| {
                after_lost_connection = attempt.after_lost_connection;
                Box::pin(
                    sqlx::query(self.sql.force_release.clone())
                        .bind(name)
                        .bind(&self.channel)
                        .bind(&self.tag)
                        .bind(fence)
                        .fetch_optional(conn),
                )
            })
            .await
            .and_then(decoded)?;
        let row = removed(row, after_lost_connection, "forced release")?;
        Ok(row.map(|(owner, fence, left, _)| holder_from_sql(owner, fence, left)))
    }

    async fn purge_expired(&self) -> Result<u64, BoxError> {
        let done = self
            .connections
            // Not retried after a lost connection: the first try may have
            // deleted rows, and a second would count fewer.
            .run(OnLostConnection::Fail, None, |conn, _| {
                Box::pin(sqlx::query(self.sql.purge.clone()).execute(conn))
            })
            .await?;
        Ok(done.rows_affected())
    }

    async fn raise_fences(&self, by: u64) -> Result<u64, BoxError> {
        let by = fence_to_sql(by);
        let (next,): (i64,) = self
            .connections
            // Not run again: a second run would raise twice.
            .run(OnLostConnection::Fail, None, |conn, _| {
                Box::pin(
                    sqlx::query_as(self.sql.raise_fences.clone())
                        .bind(by)
                        .fetch_one(conn),
                )
            })
            .await?;
        Ok(fence_from_sql(next))
    }

    async fn close(&self) -> Result<(), BoxError> {
        if let Some(listener) = self.listener.get() {
            listener.stop();
        }
        self.connections.close().await;
        self.listen_pool.close().await;
        self.pool.close().await;
        Ok(())
    }

    fn releases(&self) -> &ReleaseBus {
        &self.bus
    }

    async fn prepare_wait(&self) -> Result<(), BoxError> {
        self.listener
            .get_or_try_init(|| {
                Listener::start(
                    &self.listen_pool,
                    &self.channel,
                    &self.tag,
                    self.bus.clone(),
                )
            })
            .await?;
        Ok(())
    }

    fn name(&self) -> &'static str {
        "postgres"
    }

    fn poll_ceiling(&self) -> Duration {
        POLL_CEILING
    }
}
