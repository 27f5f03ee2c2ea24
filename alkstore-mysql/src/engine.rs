//! The row operations of the MariaDB/MySQL engine: one statement, one round
//! trip, per operation.

use std::sync::Arc;
use std::time::{Duration, Instant};

use alkstore_core::{
    Attempt, BoxError, Engine, GrantKey, Holder, LeaseMillis, Listed, ReleaseBus, fence_from_sql,
    fence_to_sql, lease_left,
};
use alkstore_sqlx::{OutOfTime, decoded};
use async_trait::async_trait;
use sqlx::MySqlPool;

use crate::connection::{Connections, LOCK_WAIT_TIMEOUT, error_number};
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

/// How many times a forced release reads the grant again when it changed
/// between its read and its delete, before it gives up.
const FORCE_RELEASE_TRIES: usize = 100;

/// The longest wait the procedure is given: a year (the server's
/// `lock_wait_timeout` goes no higher).
const MAX_WAIT_MS: u128 = 365 * 24 * 3600 * 1000;

/// The acquire procedure's bound on lock waits: the wait left, in whole
/// milliseconds (the procedure takes whole seconds of it).
fn lock_wait_ms(deadline: Instant) -> i64 {
    let left = deadline.saturating_duration_since(Instant::now());
    left.as_millis().min(MAX_WAIT_MS) as i64
}

/// True when the attempt ran out of its wait before it could decide: no
/// connection in time, or a lock wait cut by the procedure's bound. The
/// transaction rolled back (or never started), so nothing was written.
fn ran_out_of_time(error: &BoxError) -> bool {
    error.is::<OutOfTime>()
        || error
            .downcast_ref::<sqlx::Error>()
            .is_some_and(|e| error_number(e) == Some(LOCK_WAIT_TIMEOUT))
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
            .run(true, deadline, |conn, may_have_committed| {
                Box::pin(
                    sqlx::query(self.sql.acquire.clone())
                        .bind(name.as_bytes())
                        .bind(owner.as_bytes())
                        .bind(ttl.as_i64())
                        // A retry after a lost connection waits for the first try's
                        // locks, so as to learn whether it committed.
                        .bind(deadline.filter(|_| !may_have_committed).map(lock_wait_ms))
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
            Err(error) if deadline.is_some() && ran_out_of_time(&error) => {
                Attempt::Held { expires_in: None }
            }
            Err(error) => return Err(error),
        })
    }

    async fn renew(&self, grant: &GrantKey, ttl: LeaseMillis) -> Result<bool, BoxError> {
        let done = self
            .connections
            .run(true, None, |conn, _| {
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
        let done = self
            .connections
            .run(false, None, |conn, _| {
                Box::pin(
                    sqlx::query(self.sql.release.clone())
                        .bind(grant.name.as_bytes())
                        .bind(grant.owner.as_bytes())
                        .bind(fence_to_sql(grant.fence))
                        .execute(conn),
                )
            })
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn holder(&self, name: &str) -> Result<Option<Holder>, BoxError> {
        let row: Option<(Vec<u8>, i64, i64)> = self
            .connections
            .run(true, None, |conn, _| {
                Box::pin(
                    sqlx::query(self.sql.holder.clone())
                        .bind(name.as_bytes())
                        .fetch_optional(conn),
                )
            })
            .await
            .and_then(decoded)?;
        row.map(|(owner, fence, expires_in_ms)| {
            Ok(Holder {
                owner: text(owner)?,
                fence: fence_from_sql(fence),
                expires_in: lease_left(expires_in_ms),
            })
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
            .run(true, None, |conn, _| {
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
                    holder: Holder {
                        owner: text(owner)?,
                        fence: fence_from_sql(fence),
                        expires_in: lease_left(left),
                    },
                })
            })
            .collect()
    }

    /// Reads the live grant, then deletes exactly that grant if it is still
    /// live (no `DELETE … RETURNING` in MySQL): two statements, no lock
    /// held between them. A grant that changed in between (renewed, taken
    /// over, released) is read again.
    async fn force_release(
        &self,
        name: &str,
        fence: Option<u64>,
    ) -> Result<Option<Holder>, BoxError> {
        for _ in 0..FORCE_RELEASE_TRIES {
            let Some(holder) = self.holder(name).await? else {
                return Ok(None);
            };
            if fence.is_some_and(|fence| fence != holder.fence) {
                return Ok(None);
            }
            let done = self
                .connections
                // Not retried after a lost connection: the first try may
                // have removed the row, and a second would answer None.
                .run(false, None, |conn, _| {
                    Box::pin(
                        sqlx::query(self.sql.remove_live.clone())
                            .bind(name.as_bytes())
                            .bind(fence_to_sql(holder.fence))
                            .execute(conn),
                    )
                })
                .await?;
            if done.rows_affected() == 1 {
                return Ok(Some(holder));
            }
        }
        Err(format!(
            "the grant of this name changed under {FORCE_RELEASE_TRIES} forced releases in a row"
        )
        .into())
    }

    async fn purge_expired(&self) -> Result<u64, BoxError> {
        let done = self
            .connections
            // Not retried after a lost connection: the first try may have
            // deleted rows, and a second would count fewer.
            .run(false, None, |conn, _| {
                Box::pin(sqlx::query(self.sql.purge.clone()).execute(conn))
            })
            .await?;
        Ok(done.rows_affected())
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
