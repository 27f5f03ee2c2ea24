//! Checking the schema name; finding, creating, adopting and dropping
//! alkstore's objects in it.
//!
//! alkstore creates, adopts and drops only its own objects. Opening first
//! reads the catalog and the `meta` table: when everything is there and
//! marked as alkstore's, nothing else runs, so a role with only DML rights
//! on objects an administrator provisioned can open a store. Only what is
//! missing is created, under an advisory lock. Tables alkstore did not make
//! are never adopted, and dropping removes only alkstore's objects (and the
//! schema, if alkstore created it and nothing else lives there).

use alkstore_core::{BoxError, Error, Field, SchemaVersionError, check_text};
use sqlx::{PgConnection, PgPool};

use alkstore_sqlx::{Layout, Meta, Namespace, Objects};

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

/// The schema's OID and objects, as the catalog shows them now.
async fn inspect(
    conn: &mut PgConnection,
    schema: &str,
) -> Result<Option<(i64, Objects)>, sqlx::Error> {
    let row: Option<(i64, bool, bool, bool, bool)> = sqlx::query_as(sql::INSPECT)
        .bind(schema)
        .fetch_optional(conn)
        .await?;
    Ok(row.map(|(oid, meta, locks, fences, acquire)| {
        (
            oid,
            Objects {
                meta,
                locks,
                fences,
                acquire,
            },
        )
    }))
}

/// This build's layout.
const LAYOUT: Layout = Layout {
    version: sql::SCHEMA_VERSION,
    upgradable: sql::UPGRADABLE,
    created_key: sql::CREATED_SCHEMA_KEY,
    markerless_versions: true,
};

/// What `meta` says (refusing a foreign `meta`, and a version this build
/// can neither use nor upgrade).
async fn read_meta(
    conn: &mut PgConnection,
    schema: &Namespace,
    statements: &Statements,
) -> Result<Meta, BoxError> {
    let rows = sqlx::query_as(statements.read_meta.clone())
        .fetch_all(&mut *conn)
        .await;
    // 42703: undefined column.
    Meta::read(
        schema,
        &LAYOUT,
        rows,
        |error| matches!(error, sqlx::Error::Database(db) if db.code().as_deref() == Some("42703")),
    )
}

/// Finds or creates the store's objects in `schema` and returns the schema's
/// OID. Reads only, when everything is there; otherwise creates what is
/// missing under a transaction-scoped advisory lock, so that several
/// processes opening at once do not collide.
pub(crate) async fn open(
    pool: &PgPool,
    schema: &str,
    statements: &Statements,
) -> Result<i64, BoxError> {
    let namespace = Namespace::schema(schema);
    let mut conn = pool.acquire().await?;
    if let Some((oid, objects)) = inspect(&mut conn, schema).await? {
        namespace.refuse_unmarked(objects)?;
        if objects.all()
            && read_meta(&mut conn, &namespace, statements)
                .await?
                .current(&LAYOUT)
        {
            return Ok(oid);
        }
    }
    std::mem::drop(conn);
    create_missing(pool, &namespace, statements).await
}

async fn create_missing(
    pool: &PgPool,
    namespace: &Namespace,
    statements: &Statements,
) -> Result<i64, BoxError> {
    let schema = namespace.name.as_str();
    let mut tx = pool.begin().await?;
    sqlx::query(sql::READ_COMMITTED).execute(&mut *tx).await?;
    sqlx::query(sql::LOCK_SCHEMA_CREATION)
        .bind(sql::SCHEMA_LOCK_CLASS)
        .bind(schema)
        .execute(&mut *tx)
        .await?;
    let cannot = |source: sqlx::Error| -> BoxError {
        let denied =
            matches!(&source, sqlx::Error::Database(db) if db.code().as_deref() == Some("42501"));
        if denied {
            CannotCreateError {
                schema: schema.to_owned(),
                source,
            }
            .into()
        } else {
            source.into()
        }
    };
    let found = inspect(&mut tx, schema).await?;
    let (created_schema, objects) = match found {
        Some((_, objects)) => (false, objects),
        None => {
            sqlx::raw_sql(statements.create_schema.clone())
                .execute(&mut *tx)
                .await
                .map_err(cannot)?;
            (true, Objects::default())
        }
    };
    namespace.refuse_unmarked(objects)?;
    let mut upgrade = false;
    if objects.meta {
        upgrade = !read_meta(&mut tx, namespace, statements)
            .await?
            .current(&LAYOUT);
        // `meta` is made in the same transaction as the sequence: with it
        // there, a missing sequence was dropped after fences were drawn.
        if !objects.fences {
            return Err(namespace.lost_fences().into());
        }
    } else {
        sqlx::raw_sql(statements.create_meta.clone())
            .execute(&mut *tx)
            .await
            .map_err(cannot)?;
        sqlx::query(statements.record_meta.clone())
            .bind(sql::SCHEMA_VERSION)
            .bind(i64::from(created_schema))
            .execute(&mut *tx)
            .await?;
    }
    // An older layout's acquire function is replaced (only it changed).
    for (present, create) in [
        (objects.locks, &statements.create_locks),
        (objects.fences, &statements.create_fences),
        (objects.acquire && !upgrade, &statements.create_acquire),
    ] {
        if !present {
            sqlx::raw_sql(create.clone())
                .execute(&mut *tx)
                .await
                .map_err(cannot)?;
        }
    }
    if upgrade {
        sqlx::query(statements.record_version.clone())
            .bind(sql::SCHEMA_VERSION)
            .execute(&mut *tx)
            .await?;
    }
    let (oid, _) = inspect(&mut tx, schema)
        .await?
        .ok_or("the schema vanished while it was being created")?;
    tx.commit().await?;
    Ok(oid)
}

/// Drops alkstore's objects in `schema`, and the schema itself when alkstore
/// created it and nothing else lives in it. Objects alkstore did not make
/// are refused, never dropped.
pub(crate) async fn drop(
    pool: &PgPool,
    schema: &str,
    statements: &Statements,
) -> Result<(), BoxError> {
    let mut tx = pool.begin().await?;
    sqlx::query(sql::READ_COMMITTED).execute(&mut *tx).await?;
    sqlx::query(sql::LOCK_SCHEMA_CREATION)
        .bind(sql::SCHEMA_LOCK_CLASS)
        .bind(schema)
        .execute(&mut *tx)
        .await?;
    let Some((_, objects)) = inspect(&mut tx, schema).await? else {
        return Ok(());
    };
    let namespace = Namespace::schema(schema);
    namespace.refuse_unmarked(objects)?;
    if !objects.meta {
        return Ok(());
    }
    let created_schema = match read_meta(&mut tx, &namespace, statements).await {
        Ok(meta) => meta.created_namespace,
        // A version this build does not use is still alkstore's to drop.
        Err(error) if error.is::<SchemaVersionError>() => false,
        Err(error) => return Err(error),
    };
    sqlx::raw_sql(statements.drop_objects.clone())
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    if created_schema {
        // Without CASCADE: a schema that holds anything else stays.
        if let Err(error) = sqlx::raw_sql(statements.drop_schema.clone())
            .execute(pool)
            .await
        {
            let in_use = matches!(&error, sqlx::Error::Database(db) if db.code().as_deref() == Some("2BP01"));
            if !in_use {
                return Err(error.into());
            }
            tracing::info!(
                schema,
                "schema kept: it holds objects alkstore did not create"
            );
        }
    }
    Ok(())
}
