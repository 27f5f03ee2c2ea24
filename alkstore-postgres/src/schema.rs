//! Checking the schema name, and PostgreSQL's steps of opening and dropping
//! a store's schema (the order and the refusals, the same for every
//! database, are `alkstore_sqlx::lifecycle`'s).

use alkstore_core::{BoxError, Error, Field, check_text};
use alkstore_sqlx::lifecycle::Lifecycle;
use alkstore_sqlx::{Layout, Namespace, Objects, row_as};
use async_trait::async_trait;
use sqlx::{PgConnection, PgPool, SqlStr};

use crate::connection::Postgres;
use crate::protocol::Call;
use crate::sql::{self, Statements};

/// PostgreSQL keeps at most 63 bytes of an identifier and silently truncates
/// longer ones, which would make two long names one schema: refuse them.
pub const MAX_SCHEMA_BYTES: usize = 63;

pub use alkstore_sqlx::{ForeignObjectsError, LostFencesError};

/// Some of alkstore's objects are missing and this role may not create them.
#[derive(Debug, thiserror::Error)]
#[error(
    "alkstore's objects in schema {schema:?} are missing and could not be created with this \
     role's rights; have an administrator open the store once, or grant CREATE on the schema \
     (docs/engine-postgres.md lists the grants)"
)]
pub struct CannotCreateError {
    /// The schema.
    pub schema: String,
    /// Why the server refused.
    #[source]
    pub source: sqlx::Error,
}

/// 1 to 63 bytes, not whitespace only, no control characters (so no NUL), and
/// not in PostgreSQL's reserved `pg_` namespace.
pub(crate) fn validate(schema: &str) -> Result<(), Error> {
    check_text(schema, MAX_SCHEMA_BYTES).map_err(|problem| Error::InvalidName {
        field: Field::Schema,
        problem,
    })?;
    if schema.starts_with("pg_") {
        return Err(Error::ReservedName {
            field: Field::Schema,
            name: schema.to_owned(),
        });
    }
    Ok(())
}

/// This build's layout.
const LAYOUT: Layout = Layout {
    version: sql::SCHEMA_VERSION,
    upgradable: sql::UPGRADABLE,
    created_key: sql::CREATED_SCHEMA_KEY,
    markerless_versions: true,
};

/// One store's schema, as opening and dropping see it.
#[derive(Debug)]
pub(crate) struct Schema<'a> {
    namespace: Namespace,
    statements: &'a Statements,
}

impl<'a> Schema<'a> {
    pub(crate) fn new(schema: &str, statements: &'a Statements) -> Self {
        Schema {
            namespace: Namespace::schema(schema),
            statements,
        }
    }

    /// The schema's OID, which names its release channel.
    pub(crate) async fn oid(&self, pool: &PgPool) -> Result<i64, BoxError> {
        let call = Call::new(sql::SCHEMA_OID)
            .text(&self.namespace.name)
            .in_transaction();
        let row = self
            .statements
            .protocol
            .fetch_optional(call, pool)
            .await?
            .ok_or("the schema vanished after it was opened")?;
        Ok(row_as::<_, (i64,)>(row)?.0)
    }

    /// Runs DDL, naming a refusal for want of rights.
    async fn create(&self, conn: &mut PgConnection, ddl: &SqlStr) -> Result<(), BoxError> {
        match sqlx::raw_sql(ddl.clone()).execute(conn).await {
            Ok(_) => Ok(()),
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("42501") => {
                Err(CannotCreateError {
                    schema: self.namespace.name.clone(),
                    source: sqlx::Error::Database(db),
                }
                .into())
            }
            Err(error) => Err(error.into()),
        }
    }
}

/// Every step in one transaction, under a transaction-scoped advisory lock
/// on the schema's name: what one opener creates, the next sees whole.
#[async_trait]
impl Lifecycle for Schema<'_> {
    type Dialect = Postgres;
    type Locked = sqlx::Transaction<'static, sqlx::Postgres>;

    fn namespace(&self) -> &Namespace {
        &self.namespace
    }

    fn layout(&self) -> &Layout {
        &LAYOUT
    }

    async fn inspect(&self, conn: &mut PgConnection) -> Result<Option<Objects>, sqlx::Error> {
        let call = Call::new(sql::INSPECT)
            .text(&self.namespace.name)
            .in_transaction();
        let row = self.statements.protocol.fetch_optional(call, conn).await?;
        let row: Option<(bool, bool, bool, bool, bool)> = row.map(row_as).transpose()?;
        Ok(row.map(|(meta, locks, fences, acquire, permits)| Objects {
            meta,
            locks,
            fences,
            acquire,
            permits,
        }))
    }

    async fn meta_rows(&self, conn: &mut PgConnection) -> Result<Vec<(String, i64)>, sqlx::Error> {
        let call = Call::new(self.statements.read_meta.clone()).in_transaction();
        let rows = self.statements.protocol.fetch_all(call, conn).await?;
        rows.into_iter().map(row_as).collect()
    }

    /// 42703: undefined column.
    fn unlike_ours(&self, error: &sqlx::Error) -> bool {
        matches!(error, sqlx::Error::Database(db) if db.code().as_deref() == Some("42703"))
    }

    async fn lock(&self, pool: &PgPool) -> Result<Self::Locked, BoxError> {
        let mut tx = pool.begin().await?;
        sqlx::raw_sql(sql::READ_COMMITTED).execute(&mut *tx).await?;
        let call = Call::new(sql::LOCK_SCHEMA_CREATION)
            .int4(sql::SCHEMA_LOCK_CLASS)
            .text(&self.namespace.name)
            .in_transaction();
        self.statements.protocol.execute(call, &mut *tx).await?;
        Ok(tx)
    }

    async fn unlock(&self, tx: Self::Locked) -> Result<(), BoxError> {
        Ok(tx.commit().await?)
    }

    async fn create_namespace(&self, conn: &mut PgConnection) -> Result<(), BoxError> {
        self.create(conn, &self.statements.create_schema).await
    }

    async fn create_meta(
        &self,
        conn: &mut PgConnection,
        created_schema: bool,
    ) -> Result<(), BoxError> {
        self.create(conn, &self.statements.create_meta).await?;
        let call = Call::new(self.statements.record_meta.clone())
            .int8(sql::SCHEMA_VERSION)
            .int8(i64::from(created_schema))
            .in_transaction();
        self.statements.protocol.execute(call, conn).await?;
        Ok(())
    }

    /// `meta` is made in the same transaction as the sequence.
    async fn fences_were_made(&self, _conn: &mut PgConnection) -> Result<bool, BoxError> {
        Ok(true)
    }

    /// An older layout's functions are replaced, its missing `permits`
    /// table created, and its rows given their timeline (`epoch`).
    async fn create_objects(
        &self,
        conn: &mut PgConnection,
        objects: Objects,
        upgrade: bool,
    ) -> Result<(), BoxError> {
        let statements = self.statements;
        for (present, create) in [
            (objects.locks, &statements.create_locks),
            (objects.fences, &statements.create_fences),
            (objects.permits, &statements.create_permits),
            (objects.acquire && !upgrade, &statements.create_acquire),
        ] {
            if !present {
                self.create(conn, create).await?;
            }
        }
        if upgrade {
            sqlx::raw_sql(statements.add_epochs.clone())
                .execute(&mut *conn)
                .await?;
            let call = Call::new(statements.record_version.clone())
                .int8(sql::SCHEMA_VERSION)
                .in_transaction();
            statements.protocol.execute(call, conn).await?;
        }
        Ok(())
    }

    /// No CASCADE: whatever someone else built on these objects stays, and
    /// the drop fails rather than take it along.
    async fn drop_objects(&self, conn: &mut PgConnection) -> Result<(), BoxError> {
        sqlx::raw_sql(self.statements.drop_objects.clone())
            .execute(conn)
            .await?;
        Ok(())
    }

    /// The schema is dropped after the commit, without CASCADE: one that
    /// holds anything else stays (and its refusal cannot undo the drop).
    async fn finish_drop(
        &self,
        tx: Self::Locked,
        pool: &PgPool,
        created: bool,
    ) -> Result<(), BoxError> {
        tx.commit().await?;
        if !created {
            return Ok(());
        }
        match sqlx::raw_sql(self.statements.drop_schema.clone())
            .execute(pool)
            .await
        {
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("2BP01") => {
                tracing::info!(
                    schema = self.namespace.name,
                    "schema kept: it holds objects alkstore did not create"
                );
                Ok(())
            }
            done => Ok(done.map(drop)?),
        }
    }
}
