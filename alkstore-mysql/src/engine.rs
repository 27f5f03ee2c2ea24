//! The row operations of the MariaDB/MySQL engine: one statement, one round
//! trip, per operation.

use std::sync::Arc;
use std::time::{Duration, Instant};

use alkstore_core::{
    Attempt, BoxError, Engine, GrantKey, Holder, LeaseMillis, Listed, ReleaseBus, fence_from_sql,
    fence_to_sql, holder_from_sql, lease_left,
};
use alkstore_sqlx::{OnLostConnection, decoded, ran_out_of_time, removed};
use async_trait::async_trait;
use sqlx::MySqlPool;

use crate::connection::{Connections, MySql, error_number};
use crate::schema::LostFencesError;
use crate::sql::Statements;

/// How long a waiter in another process sleeps at most between attempts:
/// MariaDB has no LISTEN/NOTIFY, so a release in another process is seen by
/// polling (releases in this process wake waiters at once).
const POLL_CEILING: Duration = Duration::from_millis(50);

#[derive(Debug)]
pub(crate) struct MySqlEngine {
    pub(crate) pool: MySqlPool,
    pub(crate) database: String,
    pub(crate) connections: Connections,
    pub(crate) sql: Statements,
    pub(crate) bus: Arc<ReleaseBus>,
}

impl MySqlEngine {
    /// Drops alkstore's objects, and the database if alkstore created it and
    /// nothing else lives there.
    pub(crate) async fn drop_database(&self) -> Result<(), BoxError> {
        crate::schema::drop(&self.pool, &self.database, &self.sql).await
    }
}

/// The longest wait the procedure is given: a year (the server's
/// `lock_wait_timeout` goes no higher).
const MAX_WAIT_MS: u128 = 365 * 24 * 3600 * 1000;

/// The acquire procedure's bound on lock waits: the wait left, in whole
/// milliseconds (the procedure takes whole seconds of it).
fn lock_wait_ms(deadline: Instant) -> i64 {
    let left = deadline.saturating_duration_since(Instant::now());
    left.as_millis().min(MAX_WAIT_MS) as i64
}

/// `ER_NO_SUCH_TABLE`.
const NO_SUCH_TABLE: u16 = 1146;

/// True when the acquire procedure found no `fences` sequence to draw from
/// (dropped after the store was opened, or before, by a role that cannot
/// see it): the grant rolled back, and nothing was drawn.
fn fences_gone(error: &BoxError) -> bool {
    error.downcast_ref::<sqlx::Error>().is_some_and(|e| {
        error_number(e) == Some(NO_SUCH_TABLE)
            && matches!(e, sqlx::Error::Database(db) if db.message().contains(".fences'"))
    })
}

/// Names and owners are stored as bytes; alkstore wrote them from `&str`.
fn text(bytes: Vec<u8>) -> Result<String, BoxError> {
    Ok(String::from_utf8(bytes)?)
}

#[async_trait]
impl Engine for MySqlEngine {
    async fn acquire(
        &self,
        name: &str,
        owner: &str,
        ttl: LeaseMillis,
        deadline: Option<Instant>,
    ) -> Result<Attempt, BoxError> {
        let row: Result<Option<(i64, i64, i64)>, BoxError> = self
            .connections
            // Run again, the same owner is granted its own grant back.
            .run(OnLostConnection::RunAgain, deadline, |conn, attempt| {
                Box::pin(
                    sqlx::query(self.sql.acquire.clone())
                        .bind(name.as_bytes())
                        .bind(owner.as_bytes())
                        .bind(ttl.as_i64())
                        .bind(attempt.bound.map(lock_wait_ms))
                        .fetch_optional(conn),
                )
            })
            .await
            .and_then(decoded);
        Ok(match row {
            Ok(Some((granted, fence, expires_in_ms))) if granted != 0 => Attempt::Granted {
                fence: fence_from_sql(fence),
                expires_in: lease_left(expires_in_ms),
            },
            Ok(Some((_, _, expires_in_ms))) => Attempt::Held {
                expires_in: Some(lease_left(expires_in_ms)),
            },
            Ok(None) => return Err("the acquire procedure returned no row".into()),
            Err(error) if deadline.is_some() && ran_out_of_time::<MySql>(&error) => {
                Attempt::Held { expires_in: None }
            }
            Err(error) if fences_gone(&error) => {
                return Err(LostFencesError {
                    namespace: alkstore_sqlx::Namespace::database(&self.database),
                }
                .into());
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
                        .bind(ttl.as_i64())
                        .bind(grant.name.as_bytes())
                        .bind(grant.owner.as_bytes())
                        .bind(fence_to_sql(grant.fence))
                        .execute(conn),
                )
            })
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn release(&self, grant: &GrantKey) -> Result<bool, BoxError> {
        let mut after_lost_connection = false;
        let done = self
            .connections
            .run(OnLostConnection::RunAgain, None, |conn, attempt| {
                after_lost_connection = attempt.after_lost_connection;
                Box::pin(
                    sqlx::query(self.sql.release.clone())
                        .bind(grant.name.as_bytes())
                        .bind(grant.owner.as_bytes())
                        .bind(fence_to_sql(grant.fence))
                        .execute(conn),
                )
            })
            .await?;
        let deleted = done.rows_affected() == 1;
        Ok(removed(deleted.then_some(()), after_lost_connection, "release")?.is_some())
    }

    async fn holder(&self, name: &str) -> Result<Option<Holder>, BoxError> {
        let row: Option<(Vec<u8>, i64, i64)> = self
            .connections
            .run(OnLostConnection::RunAgain, None, |conn, _| {
                Box::pin(
                    sqlx::query(self.sql.holder.clone())
                        .bind(name.as_bytes())
                        .fetch_optional(conn),
                )
            })
            .await
            .and_then(decoded)?;
        row.map(|(owner, fence, expires_in_ms)| {
            Ok(holder_from_sql(text(owner)?, fence, expires_in_ms))
        })
        .transpose()
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
        let (prefix, after) = (
            prefix.as_bytes().to_vec(),
            after.unwrap_or("").as_bytes().to_vec(),
        );
        let rows: Vec<(Vec<u8>, Vec<u8>, i64, i64)> = self
            .connections
            .run(OnLostConnection::RunAgain, None, |conn, _| {
                Box::pin(
                    sqlx::query_as(self.sql.list.clone())
                        .bind(prefix.clone())
                        .bind(after.clone())
                        .bind(prefix.clone())
                        .bind(prefix.clone())
                        .bind(limit)
                        .fetch_all(conn),
                )
            })
            .await?;
        rows.into_iter()
            .map(|(name, owner, fence, left)| {
                Ok(Listed {
                    name: text(name)?,
                    holder: holder_from_sql(text(owner)?, fence, left),
                })
            })
            .collect()
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
        let row: Option<(Vec<u8>, i64, i64)> = self
            .connections
            .run(on_lost, None, |conn, attempt| {
                after_lost_connection = attempt.after_lost_connection;
                Box::pin(
                    sqlx::query(self.sql.force_release.clone())
                        .bind(name.as_bytes())
                        .bind(fence)
                        .bind(fence)
                        .fetch_optional(conn),
                )
            })
            .await
            .and_then(decoded)?;
        removed(row, after_lost_connection, "forced release")?
            .map(|(owner, fence, expires_in_ms)| {
                Ok(holder_from_sql(text(owner)?, fence, expires_in_ms))
            })
            .transpose()
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
        // Neither is run again after a lost connection: a second run would
        // raise twice. Grants drawing between the two cannot outrun a raise
        // of at least 2^20 (the core's least), and SETVAL never lowers.
        let (drawn,): (i64,) = self
            .connections
            .run(OnLostConnection::Fail, None, |conn, _| {
                Box::pin(sqlx::query_as(self.sql.next_fence.clone()).fetch_one(conn))
            })
            .await?;
        let target = drawn
            .checked_add(fence_to_sql(by))
            .ok_or("the fences have no room for this raise")?;
        self.connections
            .run(OnLostConnection::Fail, None, |conn, _| {
                Box::pin(sqlx::query(self.sql.set_fences(target)).execute(conn))
            })
            .await?;
        Ok(fence_from_sql(target) + 1)
    }

    async fn close(&self) -> Result<(), BoxError> {
        self.connections.close().await;
        self.pool.close().await;
        Ok(())
    }

    fn releases(&self) -> &ReleaseBus {
        &self.bus
    }

    fn name(&self) -> &'static str {
        "mysql"
    }

    fn poll_ceiling(&self) -> Duration {
        POLL_CEILING
    }
}
