//! Checking the database name; finding, creating and dropping alkstore's
//! objects in it.
//!
//! As on PostgreSQL: opening reads `information_schema` and `meta` first,
//! and when everything is there and marked as alkstore's, nothing else runs
//! (a role with only DML and EXECUTE rights can open a store). Only what is
//! missing is created, under a named lock, so that several processes opening
//! one new database at once all succeed. Tables alkstore did not make are
//! never adopted; dropping removes only alkstore's objects, and the database
//! only if alkstore created it and nothing else lives there.

use alkstore_core::{BoxError, Error, Field, NameProblem, SchemaVersionError, check_text};
use sqlx::{ConnectOptions, Connection, MySqlConnection, MySqlPool};

use alkstore_sqlx::{Layout, Meta, Namespace, Objects};

use crate::sql::{self, Statements};

/// MariaDB and MySQL refuse database names longer than 64 characters; alkstore
/// takes 64 bytes of UTF-8 at most.
pub const MAX_DATABASE_BYTES: usize = 64;

/// Databases that belong to the server.
const SERVER_DATABASES: [&str; 4] = ["mysql", "information_schema", "performance_schema", "sys"];

pub use alkstore_sqlx::{ForeignObjectsError, LostFencesError};

/// The role asked to drop alkstore's objects cannot see every trigger or
/// event in the database (`information_schema` hides those the role has no
/// privilege on), so dropping could remove someone else's along: refused,
/// nothing dropped.
#[derive(Debug, thiserror::Error)]
#[error(
    "database {database:?}: this role lacks the {privilege} privilege on it, so it cannot see \
     every {what} there, and dropping alkstore's objects could drop someone else's along; drop \
     as a role with TRIGGER and EVENT on the database"
)]
pub struct CannotSeeEverythingError {
    /// The database.
    pub database: String,
    /// The privilege missing.
    pub privilege: &'static str,
    /// What it would show.
    pub what: &'static str,
}

/// 1 to 64 bytes, not whitespace only, no control characters, no trailing
/// space (the server refuses one), no character beyond U+FFFF (server
/// identifiers are utf8mb3), and not one of the server's own databases (nor
/// a `#mysql50#` raw directory name).
pub(crate) fn validate(database: &str) -> Result<(), Error> {
    let invalid = |problem| Error::InvalidName {
        field: Field::Schema,
        problem,
    };
    check_text(database, MAX_DATABASE_BYTES).map_err(invalid)?;
    if database.ends_with(' ') {
        return Err(invalid(NameProblem::TrailingSpace));
    }
    // Identifiers are utf8mb3 on the server: no character beyond U+FFFF.
    if let Some((at, _)) = database
        .char_indices()
        .find(|(_, c)| u32::from(*c) > 0xFFFF)
    {
        return Err(invalid(NameProblem::Unsupported { at }));
    }
    // `#mysql50#` names a database by its raw directory name.
    if SERVER_DATABASES
        .iter()
        .any(|d| d.eq_ignore_ascii_case(database))
        || database.starts_with("#mysql50#")
    {
        return Err(Error::ReservedName {
            field: Field::Schema,
            name: database.to_owned(),
        });
    }
    Ok(())
}

/// Whether the database exists, and which objects it holds.
async fn inspect(
    conn: &mut MySqlConnection,
    database: &str,
) -> Result<(bool, Objects), sqlx::Error> {
    let (exists, meta, locks, fences, acquire): (i64, i64, i64, i64, i64) =
        sqlx::query_as(sql::INSPECT)
            .bind(database)
            .bind(database)
            .bind(database)
            .bind(database)
            .bind(database)
            .fetch_one(conn)
            .await?;
    Ok((
        exists != 0,
        Objects {
            meta: meta != 0,
            locks: locks != 0,
            fences: fences != 0,
            acquire: acquire != 0,
        },
    ))
}

/// This build's layout.
const LAYOUT: Layout = Layout {
    version: sql::SCHEMA_VERSION,
    upgradable: sql::UPGRADABLE,
    created_key: sql::CREATED_DATABASE_KEY,
    markerless_versions: false,
};

/// What `meta` says (refusing a foreign `meta`, and a version this build
/// can neither use nor upgrade).
async fn read_meta(
    conn: &mut MySqlConnection,
    database: &Namespace,
    statements: &Statements,
) -> Result<Meta, BoxError> {
    let rows = sqlx::query_as(statements.read_meta.clone())
        .fetch_all(&mut *conn)
        .await;
    // 1054: unknown column.
    Meta::read(database, &LAYOUT, rows, |error| {
        crate::connection::error_number(error) == Some(1054)
    })
}

/// Finds or creates the store's objects in `database`. Reads only, when
/// everything is there; otherwise decides and creates under the database's
/// creation lock.
pub(crate) async fn open(
    pool: &MySqlPool,
    database: &str,
    statements: &Statements,
) -> Result<(), BoxError> {
    {
        let mut conn = pool.acquire().await?;
        let (exists, objects) = inspect(&mut conn, database).await?;
        // `information_schema` shows only what the role has a privilege
        // on, and a role with the documented grants has none on `fences`
        // (the procedure uses it with its definer's rights): what it uses
        // itself being there is enough. A `fences` that is truly gone is
        // found by the first grant (`LostFencesError`), which draws nothing.
        if exists
            && objects.meta
            && objects.locks
            && objects.acquire
            && read_meta(&mut conn, &Namespace::database(database), statements)
                .await?
                .current(&LAYOUT)
        {
            return Ok(());
        }
    }
    under_creation_lock(pool, database, statements, Work::CreateMissing).await
}

/// What is done under the creation lock.
#[derive(Debug, Clone, Copy)]
enum Work {
    CreateMissing,
    DropOurs,
}

/// Does `work` holding the creation lock of `database`, on a connection of
/// its own that is closed afterwards (a dropped future closes it too, and
/// the server lets go of the lock). DDL commits on its own in MySQL: the
/// named lock keeps other openers and droppers out until `work` is done.
async fn under_creation_lock(
    pool: &MySqlPool,
    database: &str,
    statements: &Statements,
    work: Work,
) -> Result<(), BoxError> {
    let mut conn = pool.connect_options().connect().await?;
    let done = async {
        let (locked,): (Option<i64>,) = sqlx::query_as(sql::LOCK_CREATION)
            .bind(database)
            .fetch_one(&mut conn)
            .await?;
        if locked != Some(1) {
            return Err(
                "timed out waiting for another process creating or dropping the store's objects"
                    .into(),
            );
        }
        match work {
            Work::CreateMissing => create_missing(&mut conn, database, statements).await?,
            Work::DropOurs => drop_ours(&mut conn, database, statements).await?,
        }
        sqlx::query(sql::UNLOCK_CREATION)
            .bind(database)
            .execute(&mut conn)
            .await?;
        Ok::<_, BoxError>(())
    }
    .await;
    let _ = conn.close().await;
    done
}

/// Under the creation lock: looks again, refuses what is not alkstore's,
/// and creates what is missing — `meta` (with its marker) first, so that
/// every other object alkstore makes is found next to it, and the
/// `fences_created` mark right after the sequence, so that a missing
/// sequence is told apart from one never made.
async fn create_missing(
    conn: &mut MySqlConnection,
    database: &str,
    statements: &Statements,
) -> Result<(), BoxError> {
    let namespace = Namespace::database(database);
    let (exists, objects) = inspect(conn, database).await?;
    let created_database = !exists;
    if !exists {
        sqlx::raw_sql(statements.create_database.clone())
            .execute(&mut *conn)
            .await?;
    }
    namespace.refuse_unmarked(objects)?;
    let mut upgrade = false;
    if objects.meta {
        upgrade = !read_meta(conn, &namespace, statements)
            .await?
            .current(&LAYOUT);
        let (fences_created,): (i64,) = sqlx::query_as(statements.fences_created.clone())
            .fetch_one(&mut *conn)
            .await?;
        if fences_created != 0 && !objects.fences {
            return Err(namespace.lost_fences().into());
        }
    } else {
        sqlx::raw_sql(statements.create_meta[usize::from(created_database)].clone())
            .execute(&mut *conn)
            .await?;
    }
    if !objects.locks {
        sqlx::raw_sql(statements.create_locks.clone())
            .execute(&mut *conn)
            .await?;
    }
    if !objects.fences {
        sqlx::raw_sql(statements.create_fences.clone())
            .execute(&mut *conn)
            .await?;
    }
    sqlx::query(statements.record_fences.clone())
        .execute(&mut *conn)
        .await?;
    // An older layout's procedure (only it changed) is replaced in one
    // statement: a CALL of a process already open never finds it missing.
    if !objects.acquire || upgrade {
        sqlx::raw_sql(statements.create_acquire.clone())
            .execute(&mut *conn)
            .await?;
    }
    if upgrade {
        sqlx::query(statements.record_drawn_by.clone())
            .execute(&mut *conn)
            .await?;
        sqlx::query(statements.record_version.clone())
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// Drops alkstore's objects in `database`, and the database itself when
/// alkstore created it and nothing else lives in it — decided and done under
/// the creation lock, so that no opener makes objects in between. Refuses,
/// dropping nothing, when someone else's trigger sits on alkstore's tables
/// (dropping a table drops its triggers along).
pub(crate) async fn drop(
    pool: &MySqlPool,
    database: &str,
    statements: &Statements,
) -> Result<(), BoxError> {
    under_creation_lock(pool, database, statements, Work::DropOurs).await
}

async fn drop_ours(
    conn: &mut MySqlConnection,
    database: &str,
    statements: &Statements,
) -> Result<(), BoxError> {
    let namespace = Namespace::database(database);
    let (exists, objects) = inspect(conn, database).await?;
    if !exists {
        return Ok(());
    }
    namespace.refuse_unmarked(objects)?;
    if !objects.meta {
        return Ok(());
    }
    let created_database = match read_meta(conn, &namespace, statements).await {
        Ok(meta) => meta.created_namespace,
        // A version this build does not use is still alkstore's to drop.
        Err(error) if error.is::<SchemaVersionError>() => false,
        Err(error) => return Err(error),
    };
    let (triggers_seen, events_seen): (i64, i64) = sqlx::query_as(sql::SEES_TRIGGERS_AND_EVENTS)
        .bind(database)
        .fetch_one(&mut *conn)
        .await?;
    for (seen, privilege, what) in [
        (triggers_seen, "TRIGGER", "trigger"),
        (events_seen, "EVENT", "event"),
    ] {
        if seen == 0 {
            return Err(CannotSeeEverythingError {
                database: database.to_owned(),
                privilege,
                what,
            }
            .into());
        }
    }
    let (triggers,): (i64,) = sqlx::query_as(sql::COUNT_TRIGGERS_ON_OURS)
        .bind(database)
        .fetch_one(&mut *conn)
        .await?;
    if triggers > 0 {
        return Err(namespace
            .holds_foreign("a trigger on alkstore's tables")
            .into());
    }
    for statement in &statements.drop_objects {
        sqlx::raw_sql(statement.clone()).execute(&mut *conn).await?;
    }
    if created_database {
        let (others,): (i64,) = sqlx::query_as(sql::COUNT_OBJECTS)
            .bind(database)
            .bind(database)
            .bind(database)
            .bind(database)
            .fetch_one(&mut *conn)
            .await?;
        if others == 0 {
            sqlx::raw_sql(statements.drop_database.clone())
                .execute(&mut *conn)
                .await?;
        } else {
            tracing::info!(
                database,
                "database kept: it holds objects alkstore did not create"
            );
        }
    }
    Ok(())
}
