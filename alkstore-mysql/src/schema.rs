//! Checking the database name, and MariaDB's steps of opening and dropping
//! a store's database (the order and the refusals, the same for every
//! database, are `alkstore_sqlx::lifecycle`'s).

use alkstore_core::{BoxError, Error, Field, NameProblem, check_text};
use alkstore_sqlx::lifecycle::Lifecycle;
use alkstore_sqlx::{Layout, Namespace, Objects};
use async_trait::async_trait;
use sqlx::{ConnectOptions, Connection, MySqlConnection, MySqlPool, SqlStr};

use crate::connection::MySql;
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

/// This build's layout.
const LAYOUT: Layout = Layout {
    version: sql::SCHEMA_VERSION,
    upgradable: sql::UPGRADABLE,
    created_key: sql::CREATED_DATABASE_KEY,
    markerless_versions: false,
};

/// One store's database, as opening and dropping see it.
#[derive(Debug)]
pub(crate) struct Database<'a> {
    namespace: Namespace,
    statements: &'a Statements,
}

impl<'a> Database<'a> {
    pub(crate) fn new(database: &str, statements: &'a Statements) -> Self {
        Database {
            namespace: Namespace::database(database),
            statements,
        }
    }

    fn name(&self) -> &str {
        &self.namespace.name
    }

    /// Runs each statement in turn.
    async fn run(conn: &mut MySqlConnection, statements: &[&SqlStr]) -> Result<(), BoxError> {
        for statement in statements {
            sqlx::raw_sql((*statement).clone())
                .execute(&mut *conn)
                .await?;
        }
        Ok(())
    }
}

/// DDL commits on its own in MySQL: the creation lock, a session-level
/// named lock on a connection of its own (closed afterwards, so that a
/// dropped future lets go of the lock too), keeps other openers and
/// droppers out until the work is done.
#[async_trait]
impl Lifecycle for Database<'_> {
    type Dialect = MySql;
    type Locked = Box<MySqlConnection>;

    fn namespace(&self) -> &Namespace {
        &self.namespace
    }

    fn layout(&self) -> &Layout {
        &LAYOUT
    }

    async fn inspect(&self, conn: &mut MySqlConnection) -> Result<Option<Objects>, sqlx::Error> {
        let name = self.name();
        let mut inspect = sqlx::query_as(sql::INSPECT);
        for _ in 0..8 {
            inspect = inspect.bind(name);
        }
        let (exists, meta, locks, fences, acquire, permits): (i64, i64, i64, i64, i64, i64) =
            inspect.fetch_one(conn).await?;
        Ok((exists != 0).then_some(Objects {
            meta: meta != 0,
            locks: locks != 0,
            fences: fences != 0,
            acquire: acquire != 0,
            permits: permits != 0,
        }))
    }

    /// `information_schema` shows only what the role has a privilege on,
    /// and a role with the documented grants has none on `fences` (the
    /// procedure uses it with its definer's rights): what it uses itself
    /// being there is enough. A `fences` that is truly gone is found by the
    /// first grant (`LostFencesError`), which draws nothing.
    fn ready(&self, objects: Objects) -> bool {
        objects.meta && objects.locks && objects.acquire
    }

    async fn meta_rows(
        &self,
        conn: &mut MySqlConnection,
    ) -> Result<Vec<(String, i64)>, sqlx::Error> {
        sqlx::query_as(self.statements.read_meta.clone())
            .fetch_all(conn)
            .await
    }

    /// 1054: unknown column.
    fn unlike_ours(&self, error: &sqlx::Error) -> bool {
        crate::connection::error_number(error) == Some(1054)
    }

    async fn lock(&self, pool: &MySqlPool) -> Result<Self::Locked, BoxError> {
        let mut conn = Box::new(pool.connect_options().connect().await?);
        let (locked,): (Option<i64>,) = sqlx::query_as(sql::LOCK_CREATION)
            .bind(self.name())
            .fetch_one(&mut *conn)
            .await?;
        if locked != Some(1) {
            return Err(
                "timed out waiting for another process creating or dropping the store's objects"
                    .into(),
            );
        }
        Ok(conn)
    }

    async fn unlock(&self, mut conn: Self::Locked) -> Result<(), BoxError> {
        sqlx::query(sql::UNLOCK_CREATION)
            .bind(self.name())
            .execute(&mut *conn)
            .await?;
        let _ = conn.close().await;
        Ok(())
    }

    /// DDL already committed stays; the named lock goes with the session.
    async fn abandon(&self, conn: Self::Locked) {
        let _ = conn.close().await;
    }

    async fn create_namespace(&self, conn: &mut MySqlConnection) -> Result<(), BoxError> {
        Self::run(conn, &[&self.statements.create_database]).await
    }

    /// With its marker rows, in one statement.
    async fn create_meta(
        &self,
        conn: &mut MySqlConnection,
        created_database: bool,
    ) -> Result<(), BoxError> {
        let create = &self.statements.create_meta[usize::from(created_database)];
        Self::run(conn, &[create]).await
    }

    /// The `fences_created` mark, recorded right after the sequence.
    async fn fences_were_made(&self, conn: &mut MySqlConnection) -> Result<bool, BoxError> {
        let (marks,): (i64,) = sqlx::query_as(self.statements.fences_created.clone())
            .fetch_one(conn)
            .await?;
        Ok(marks != 0)
    }

    /// An older layout's procedures are replaced, each in one statement (a
    /// CALL of a process already open never finds one missing), after its
    /// tables are given their `epoch` columns; then its rows their epoch.
    async fn create_objects(
        &self,
        conn: &mut MySqlConnection,
        objects: Objects,
        upgrade: bool,
    ) -> Result<(), BoxError> {
        let statements = self.statements;
        if !objects.locks {
            Self::run(conn, &[&statements.create_locks]).await?;
        }
        if !objects.fences {
            Self::run(conn, &[&statements.create_fences]).await?;
        }
        if !objects.permits {
            Self::run(conn, &[&statements.create_permits]).await?;
        }
        Self::run(conn, &[&statements.record_fences]).await?;
        let [set_locks, set_permits] = &statements.set_epochs;
        if upgrade {
            // The columns, the epoch, and the rows' epochs before the new
            // procedures run (their renewals test it) and again after (rows
            // an old procedure granted meanwhile).
            let [locks, permits] = &statements.add_epochs;
            Self::run(
                conn,
                &[
                    locks,
                    permits,
                    &statements.record_drawn_by,
                    set_locks,
                    set_permits,
                ],
            )
            .await?;
        }
        if !objects.acquire || upgrade {
            let [tickets, ticket_numbers] = &statements.create_tickets;
            Self::run(
                conn,
                &[
                    tickets,
                    ticket_numbers,
                    &statements.create_acquire,
                    &statements.create_acquire_permit,
                    &statements.create_acquire_rw,
                ],
            )
            .await?;
        }
        if upgrade {
            Self::run(conn, &[set_locks, set_permits, &statements.record_version]).await?;
        }
        Ok(())
    }

    /// Refuses when the role cannot see every trigger and event, or when
    /// someone else's trigger sits on alkstore's tables (dropping a table
    /// drops its triggers along).
    async fn may_drop(&self, conn: &mut MySqlConnection) -> Result<(), BoxError> {
        let (triggers_seen, events_seen): (i64, i64) =
            sqlx::query_as(sql::SEES_TRIGGERS_AND_EVENTS)
                .bind(self.name())
                .fetch_one(&mut *conn)
                .await?;
        for (seen, privilege, what) in [
            (triggers_seen, "TRIGGER", "trigger"),
            (events_seen, "EVENT", "event"),
        ] {
            if seen == 0 {
                return Err(CannotSeeEverythingError {
                    database: self.name().to_owned(),
                    privilege,
                    what,
                }
                .into());
            }
        }
        let (triggers,): (i64,) = sqlx::query_as(sql::COUNT_TRIGGERS_ON_OURS)
            .bind(self.name())
            .fetch_one(conn)
            .await?;
        if triggers > 0 {
            return Err(self
                .namespace
                .holds_foreign("a trigger on alkstore's tables")
                .into());
        }
        Ok(())
    }

    async fn drop_objects(&self, conn: &mut MySqlConnection) -> Result<(), BoxError> {
        let drops: Vec<&SqlStr> = self.statements.drop_objects.iter().collect();
        Self::run(conn, &drops).await
    }

    /// Under the creation lock: the database is dropped only when the role
    /// sees nothing else in it.
    async fn finish_drop(
        &self,
        mut conn: Self::Locked,
        _pool: &MySqlPool,
        created: bool,
    ) -> Result<(), BoxError> {
        if created {
            let name = self.name();
            let (others,): (i64,) = sqlx::query_as(sql::COUNT_OBJECTS)
                .bind(name)
                .bind(name)
                .bind(name)
                .bind(name)
                .fetch_one(&mut *conn)
                .await?;
            if others == 0 {
                Self::run(&mut conn, &[&self.statements.drop_database]).await?;
            } else {
                tracing::info!(
                    database = name,
                    "database kept: it holds objects alkstore did not create"
                );
            }
        }
        self.unlock(conn).await
    }
}
