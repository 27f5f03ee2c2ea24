//! Checking the schema name, and creating the schema on open.

use alkstore_core::{Error, Field, check_text};
use sqlx::PgPool;

use crate::sql::{self, Statements};

/// PostgreSQL keeps at most 63 bytes of an identifier and silently truncates
/// longer ones, which would make two long names one schema: refuse them.
pub const MAX_SCHEMA_BYTES: usize = 63;

/// The schema holds a version written by a newer alkstore.
#[derive(Debug, thiserror::Error)]
#[error(
    "the schema holds alkstore schema version {found}; this build knows version {known} and older"
)]
pub struct SchemaVersionError {
    /// The version found.
    pub found: i64,
    /// The newest version this build understands.
    pub known: i64,
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
            name: schema.to_owned(),
        });
    }
    Ok(())
}

/// Creates the schema and its objects if missing, under a transaction-scoped
/// advisory lock so that several processes opening at once do not collide,
/// checks the recorded version, and returns the schema's OID.
pub(crate) async fn create(
    pool: &PgPool,
    schema: &str,
    statements: &Statements,
) -> Result<i64, sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query(sql::LOCK_SCHEMA_CREATION)
        .bind(sql::SCHEMA_LOCK_CLASS)
        .bind(schema)
        .execute(&mut *tx)
        .await?;
    sqlx::raw_sql(statements.create_schema.clone())
        .execute(&mut *tx)
        .await?;
    let (found,): (i64,) = sqlx::query_as(statements.schema_version.clone())
        .fetch_one(&mut *tx)
        .await?;
    if found > sql::SCHEMA_VERSION {
        return Err(sqlx::Error::Configuration(Box::new(SchemaVersionError {
            found,
            known: sql::SCHEMA_VERSION,
        })));
    }
    let (oid,): (i64,) = sqlx::query_as(sql::SCHEMA_OID)
        .bind(schema)
        .fetch_one(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(oid)
}
