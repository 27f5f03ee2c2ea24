//! The row operations of the PostgreSQL engine: one statement, one round
//! trip, per operation.

use std::sync::Arc;
use std::time::Duration;

use alkstore_core::{Attempt, BoxError, Engine, GrantKey, Holder, LeaseMillis, ReleaseBus};
use async_trait::async_trait;
use sqlx::PgPool;
use tokio::sync::OnceCell;

use crate::connections::{Connections, on_connection};
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

fn millis(ms: i64) -> Duration {
    Duration::from_millis(ms.max(0) as u64)
}

#[async_trait]
impl Engine for PgEngine {
    async fn acquire(
        &self,
        name: &str,
        owner: &str,
        ttl: LeaseMillis,
    ) -> Result<Attempt, BoxError> {
        let row: Option<(bool, i64, i64)> = on_connection!(self.connections, idempotent: true, |conn| sqlx::query_as(
                self.sql.acquire.clone()
            )
            .bind(name)
            .bind(owner)
            .bind(ttl.as_i64())
            .fetch_optional(conn))?;
        Ok(match row {
            Some((true, fence, left_ms)) => Attempt::Granted {
                fence: fence as u64,
                left: millis(left_ms),
            },
            Some((false, _, left_ms)) => Attempt::Held {
                expires_in: Some(millis(left_ms)),
            },
            // A concurrent grant won the race after our snapshot: held.
            None => Attempt::Held { expires_in: None },
        })
    }

    async fn renew(&self, grant: &GrantKey, ttl: LeaseMillis) -> Result<bool, BoxError> {
        let done = on_connection!(self.connections, idempotent: true, |conn| sqlx::query(
            self.sql.renew.clone()
        )
            .bind(&grant.name)
            .bind(&grant.owner)
            .bind(grant.fence as i64)
            .bind(ttl.as_i64())
            .execute(conn))?;
        Ok(done.rows_affected() == 1)
    }

    async fn release(&self, grant: &GrantKey) -> Result<bool, BoxError> {
        let (deleted,): (i64,) = on_connection!(self.connections, idempotent: false, |conn| sqlx::query_as(
            self.sql.release.clone()
        )
        .bind(&grant.name)
        .bind(&grant.owner)
        .bind(grant.fence as i64)
        .bind(&self.channel)
        .bind(&self.tag)
        .fetch_one(conn))?;
        if deleted == 1 {
            // Waiters in this process need not wait for the notification's trip.
            self.bus.released(&grant.name);
        }
        Ok(deleted == 1)
    }

    async fn holder(&self, name: &str) -> Result<Option<Holder>, BoxError> {
        let row: Option<(String, i64, i64)> = on_connection!(self.connections, idempotent: true, |conn| sqlx::query_as(
                self.sql.holder.clone()
            )
            .bind(name)
            .fetch_optional(conn))?;
        Ok(row.map(|(owner, fence, left_ms)| Holder {
            owner,
            fence: fence as u64,
            expires_in: millis(left_ms),
        }))
    }

    async fn purge_expired(&self) -> Result<u64, BoxError> {
        let done = on_connection!(self.connections, idempotent: true, |conn| sqlx::query(
            self.sql.purge.clone()
        )
            .execute(conn))?;
        Ok(done.rows_affected())
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

    fn poll_ceiling(&self) -> Duration {
        POLL_CEILING
    }
}
