//! Opening and dropping a store's namespace, the same order and refusals
//! for every database; what differs is a dialect's [`Lifecycle`].
//!
//! alkstore creates, adopts and drops only its own objects. Opening first
//! reads the catalog and `meta`: when everything is there and marked as
//! alkstore's, nothing else runs, so a role with only the rights to use a
//! store can open one an administrator provisioned. Only what is missing is
//! created, under the namespace's creation lock, so that several processes
//! opening at once all succeed. Objects without `meta` are never adopted;
//! dropping removes only alkstore's objects, and the namespace only if
//! alkstore created it and nothing else lives there.

use std::ops::DerefMut;

use alkstore_core::{BoxError, SchemaVersionError};
use async_trait::async_trait;

use crate::{Conn, Dialect, Layout, Meta, Namespace, Objects};

/// The pool of a dialect's database.
pub type Pool<D> = sqlx::Pool<<D as Dialect>::Database>;

/// What one database does to a store's namespace, step by step; [`open`]
/// and [`drop`] call them in order. Every step but [`Lifecycle::lock`] runs
/// on the connection holding the creation lock (or, for the first look of
/// [`open`], on one of the pool's).
#[async_trait]
pub trait Lifecycle: Send + Sync {
    /// The database.
    type Dialect: Dialect;

    /// A connection holding the namespace's creation lock, which keeps
    /// other openers and droppers out until [`Lifecycle::unlock`] (or, after
    /// a failure, [`Lifecycle::abandon`]).
    type Locked: DerefMut<Target = Conn<Self::Dialect>> + Send;

    /// The namespace.
    fn namespace(&self) -> &Namespace;

    /// This build's layout.
    fn layout(&self) -> &Layout;

    /// The objects of a namespace there, `None` when there is no namespace.
    async fn inspect(&self, conn: &mut Conn<Self::Dialect>)
    -> Result<Option<Objects>, sqlx::Error>;

    /// Enough is there to open without the creation lock. The default: all
    /// four objects (MariaDB's role with the documented grants cannot see
    /// `fences`, which its procedure uses with its definer's rights).
    fn ready(&self, objects: Objects) -> bool {
        objects.all()
    }

    /// `meta`'s `(key, value)` rows.
    async fn meta_rows(
        &self,
        conn: &mut Conn<Self::Dialect>,
    ) -> Result<Vec<(String, i64)>, sqlx::Error>;

    /// The error says `meta`'s columns are not alkstore's.
    fn unlike_ours(&self, error: &sqlx::Error) -> bool;

    /// Takes the creation lock.
    async fn lock(&self, pool: &Pool<Self::Dialect>) -> Result<Self::Locked, BoxError>;

    /// Keeps what was done and lets go of the creation lock.
    async fn unlock(&self, locked: Self::Locked) -> Result<(), BoxError>;

    /// After a failure: lets go of the creation lock, keeping only what the
    /// database already committed. The default drops the connection (a
    /// transaction rolls back; the session's locks go with it).
    async fn abandon(&self, locked: Self::Locked) {
        std::mem::drop(locked);
    }

    /// Creates the namespace.
    async fn create_namespace(&self, conn: &mut Conn<Self::Dialect>) -> Result<(), BoxError>;

    /// Creates `meta`, marked as alkstore's, recording this layout and
    /// whether alkstore `created_namespace`.
    async fn create_meta(
        &self,
        conn: &mut Conn<Self::Dialect>,
        created_namespace: bool,
    ) -> Result<(), BoxError>;

    /// With `meta` there and `fences` not: fences were handed out before,
    /// so the sequence was lost rather than never made.
    async fn fences_were_made(&self, conn: &mut Conn<Self::Dialect>) -> Result<bool, BoxError>;

    /// Creates the objects `objects` lacks besides `meta` (the acquire
    /// routine also when `upgrade`: only it changes between layouts), and
    /// records an upgrade.
    async fn create_objects(
        &self,
        conn: &mut Conn<Self::Dialect>,
        objects: Objects,
        upgrade: bool,
    ) -> Result<(), BoxError>;

    /// Refuses, before anything is dropped, what dropping would take along
    /// or cannot see. The default: nothing to refuse.
    async fn may_drop(&self, conn: &mut Conn<Self::Dialect>) -> Result<(), BoxError> {
        let _ = conn;
        Ok(())
    }

    /// Drops alkstore's four objects.
    async fn drop_objects(&self, conn: &mut Conn<Self::Dialect>) -> Result<(), BoxError>;

    /// After [`Lifecycle::drop_objects`]: keeps the drop, lets go of the
    /// creation lock, and drops the namespace when `created` (alkstore made
    /// it) and nothing else lives there.
    async fn finish_drop(
        &self,
        locked: Self::Locked,
        pool: &Pool<Self::Dialect>,
        created: bool,
    ) -> Result<(), BoxError>;
}

/// What `meta` says, refusing someone else's and a layout this build can
/// neither use nor upgrade.
async fn read_meta<L: Lifecycle>(
    lifecycle: &L,
    conn: &mut Conn<L::Dialect>,
) -> Result<Meta, BoxError> {
    let rows = lifecycle.meta_rows(conn).await;
    Meta::read(lifecycle.namespace(), lifecycle.layout(), rows, |error| {
        lifecycle.unlike_ours(error)
    })
}

/// Finds or creates the store's objects. Reads only, when everything is
/// there; otherwise decides and creates under the creation lock.
pub async fn open<L: Lifecycle>(lifecycle: &L, pool: &Pool<L::Dialect>) -> Result<(), BoxError> {
    {
        let mut conn = pool.acquire().await?;
        if let Some(objects) = lifecycle.inspect(&mut conn).await? {
            lifecycle.namespace().refuse_unmarked(objects)?;
            if lifecycle.ready(objects)
                && read_meta(lifecycle, &mut conn)
                    .await?
                    .current(lifecycle.layout())
            {
                return Ok(());
            }
        }
    }
    let mut locked = lifecycle.lock(pool).await?;
    match create_missing(lifecycle, &mut locked).await {
        Ok(()) => lifecycle.unlock(locked).await,
        Err(error) => {
            lifecycle.abandon(locked).await;
            Err(error)
        }
    }
}

/// Under the creation lock: looks again, refuses what is not alkstore's,
/// and creates what is missing — `meta` (with its marker) first, so that
/// every other object alkstore makes is found next to it.
async fn create_missing<L: Lifecycle>(
    lifecycle: &L,
    conn: &mut Conn<L::Dialect>,
) -> Result<(), BoxError> {
    let namespace = lifecycle.namespace();
    let found = lifecycle.inspect(conn).await?;
    let created = found.is_none();
    if created {
        lifecycle.create_namespace(conn).await?;
    }
    let objects = found.unwrap_or_default();
    namespace.refuse_unmarked(objects)?;
    let mut upgrade = false;
    if objects.meta {
        upgrade = !read_meta(lifecycle, conn)
            .await?
            .current(lifecycle.layout());
        if !objects.fences && lifecycle.fences_were_made(conn).await? {
            return Err(namespace.lost_fences().into());
        }
    } else {
        lifecycle.create_meta(conn, created).await?;
    }
    lifecycle.create_objects(conn, objects, upgrade).await
}

/// Drops alkstore's objects, and the namespace when alkstore created it and
/// nothing else lives in it, decided and done under the creation lock, so
/// that no opener makes objects in between. Objects alkstore did not make
/// are refused, never dropped.
pub async fn drop<L: Lifecycle>(lifecycle: &L, pool: &Pool<L::Dialect>) -> Result<(), BoxError> {
    let mut locked = lifecycle.lock(pool).await?;
    match drop_ours(lifecycle, &mut locked).await {
        Ok(Some(created)) => lifecycle.finish_drop(locked, pool, created).await,
        Ok(None) => lifecycle.unlock(locked).await,
        Err(error) => {
            lifecycle.abandon(locked).await;
            Err(error)
        }
    }
}

/// Drops alkstore's objects; answers whether alkstore created the
/// namespace, or `None` when there was nothing of alkstore's to drop.
async fn drop_ours<L: Lifecycle>(
    lifecycle: &L,
    conn: &mut Conn<L::Dialect>,
) -> Result<Option<bool>, BoxError> {
    let Some(objects) = lifecycle.inspect(conn).await? else {
        return Ok(None);
    };
    lifecycle.namespace().refuse_unmarked(objects)?;
    if !objects.meta {
        return Ok(None);
    }
    let created = match read_meta(lifecycle, conn).await {
        Ok(meta) => meta.created_namespace,
        // A version this build does not use is still alkstore's to drop.
        Err(error) if error.is::<SchemaVersionError>() => false,
        Err(error) => return Err(error),
    };
    lifecycle.may_drop(conn).await?;
    lifecycle.drop_objects(conn).await?;
    Ok(Some(created))
}
