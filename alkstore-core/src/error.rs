//! The one error type every engine returns, and the public sources it carries.

use std::fmt;

/// A boxed error, as carried in [`Error::Database`]'s source chain.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Shorthand for `std::result::Result<T, alkstore_core::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong with a call on a [`Store`](crate::Store) or a [`Lock`](crate::Lock).
///
/// The detail of a [`Error::Database`] lives in its source chain (walk it with
/// [`std::error::Error::source`]), never repeated in its `Display`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A lock name or an owner failed validation; nothing was sent to storage.
    #[error("invalid {field}: {problem}")]
    InvalidName {
        /// Which argument was rejected.
        field: Field,
        /// Why it was rejected.
        problem: NameProblem,
    },
    /// The name is in a reserved namespace (a lock name starting with
    /// `alkstore.`, a PostgreSQL schema starting with `pg_`); nothing was
    /// sent to storage.
    #[error("{field} {name:?} is reserved: {}", reserved_because(*field))]
    ReservedName {
        /// Which argument was rejected.
        field: Field,
        /// The rejected name.
        name: String,
    },
    /// A page size [`Store::list`](crate::Store::list) cannot serve: it
    /// must be 1 to `max`; nothing was sent to storage.
    #[error("invalid page size {limit}: a page holds 1 to {max} names")]
    InvalidLimit {
        /// The page size asked for.
        limit: usize,
        /// The most a page holds ([`MAX_LIST_LIMIT`](crate::MAX_LIST_LIMIT)).
        max: usize,
    },
    /// A fence raise [`Store::raise_fences`](crate::Store::raise_fences)
    /// will not make: it must be `min` to `max`; nothing was sent to storage.
    #[error(
        "invalid fence raise {by}: raise by {min} to {max} (less could be outrun by grants \
         drawing meanwhile; more wastes the fences' room)"
    )]
    InvalidRaise {
        /// The raise asked for.
        by: u64,
        /// The least ([`MIN_FENCE_RAISE`](crate::MIN_FENCE_RAISE)).
        min: u64,
        /// The most ([`MAX_FENCE_RAISE`](crate::MAX_FENCE_RAISE)).
        max: u64,
    },
    /// A semaphore's permits the store will not keep: 1 to `max`; nothing
    /// was sent to storage.
    #[error("invalid permits {permits}: a semaphore has 1 to {max} permits")]
    InvalidPermits {
        /// The permits asked for.
        permits: u32,
        /// The most ([`MAX_PERMITS`](crate::MAX_PERMITS)).
        max: u32,
    },
    /// A permit of `name` was asked with `asked` permits while live grants
    /// of it have `live`: every holder of one semaphore must name the same
    /// number. Nothing was written.
    #[error(
        "semaphore {name:?} has {live} permits (its live grants say so); this acquire asked for \
         {asked}: every holder of one semaphore must ask for the same number"
    )]
    PermitsMismatch {
        /// The semaphore's name.
        name: String,
        /// The permits this acquire asked for.
        asked: u32,
        /// The permits of the live grants.
        live: u32,
    },
    /// The name is held as the other kind of grant (a lock asked of a
    /// semaphore's name, or a permit of a lock's), or a semaphore's name was
    /// given to an operation on one grant of a lock. Nothing was written.
    #[error(
        "{name:?} is held as {held_as}, which this call cannot act on: a name is a lock or a \
         semaphore, never both at once, and a semaphore's permits are released by force one at \
         a time, by fence"
    )]
    HeldAsOtherKind {
        /// The name.
        name: String,
        /// What holds it.
        held_as: crate::HeldAs,
    },
    /// No fence is left for this: a grant when every fence up to
    /// [`MAX_FENCE`](crate::MAX_FENCE) has been drawn, or a
    /// [`raise_fences`](crate::Store::raise_fences) by at least the fences
    /// left. Decided before anything was written: the store stays usable
    /// (renewals, releases, reads; grants while fences are left). A fence
    /// never wraps, repeats or changes type: past the end, grants stop.
    #[error(
        "{operation}: the fences have run out ({left} left below the end, {}); a fence never \
         wraps or repeats, so grants stop there (a store restored elsewhere, or a new \
         namespace, starts again from 1)",
        crate::MAX_FENCE
    )]
    FencesExhausted {
        /// The operation refused, such as `"try_lock"` or `"raise_fences"`.
        operation: &'static str,
        /// How many fences were left: 0 for a grant; for a raise, no more
        /// than it asked (the lowest later fence must itself be a fence).
        left: u64,
    },
    /// The operation could not be carried out; the cause is the source.
    ///
    /// Sources alkstore itself puts here: [`DurationError`] (a bad lease
    /// duration, rejected before any round trip) and [`Closed`] (the store was
    /// closed). Engine failures carry the driver's error.
    #[error("{operation} failed")]
    Database {
        /// The operation that failed, such as `"try_lock"`.
        operation: &'static str,
        /// The cause.
        #[source]
        source: BoxError,
    },
}

/// Whose namespace a reserved name belongs to.
fn reserved_because(field: Field) -> String {
    match field {
        Field::Schema => "the database server keeps it for itself (PostgreSQL's `pg_…` \
                          schemas, MySQL's `mysql`, `sys` and `…_schema` databases)"
            .to_owned(),
        _ => format!(
            "names starting with `{}` belong to alkstore",
            crate::name::RESERVED_PREFIX
        ),
    }
}

impl Error {
    /// Wraps any error as [`Error::Database`] for `operation`.
    pub fn database(operation: &'static str, source: impl Into<BoxError>) -> Self {
        Error::Database {
            operation,
            source: source.into(),
        }
    }

    /// An engine's error for `operation`: [`Error::FencesExhausted`] when
    /// the engine says no fence is left ([`NoFenceLeft`]),
    /// [`Error::Database`] otherwise.
    /// The [`NoFenceLeft`] may sit anywhere in the source's chain (a
    /// driver's error wrapping the engine's).
    pub fn from_engine(operation: &'static str, source: BoxError) -> Self {
        let mut next: Option<&(dyn std::error::Error + 'static)> = Some(&*source);
        while let Some(error) = next {
            if let Some(no_room) = error.downcast_ref::<NoFenceLeft>() {
                return Error::FencesExhausted {
                    operation,
                    left: no_room.left,
                };
            }
            next = error.source();
        }
        Error::database(operation, source)
    }

    /// Wraps [`Closed`] for `operation`.
    pub fn closed(operation: &'static str) -> Self {
        Error::database(operation, Closed)
    }

    /// True when the source chain holds a [`Closed`].
    pub fn is_closed(&self) -> bool {
        self.find_source::<Closed>().is_some()
    }

    /// The first error of type `E` in this error's source chain, if any.
    pub fn find_source<E: std::error::Error + 'static>(&self) -> Option<&E> {
        let mut next: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(self);
        while let Some(err) = next {
            if let Some(found) = err.downcast_ref::<E>() {
                return Some(found);
            }
            next = err.source();
        }
        None
    }
}

/// Which argument a validation error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Field {
    /// The lock name.
    Name,
    /// The owner.
    Owner,
    /// An engine's namespace, such as a PostgreSQL schema name.
    Schema,
    /// The name prefix of a listing.
    Prefix,
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Field::Name => "lock name",
            Field::Owner => "owner",
            Field::Schema => "schema name",
            Field::Prefix => "name prefix",
        })
    }
}

/// Why a name or an owner was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameProblem {
    /// Zero bytes long.
    #[error("it is empty")]
    Empty,
    /// Longer than allowed ([`MAX_NAME_BYTES`](crate::MAX_NAME_BYTES) bytes of
    /// UTF-8 for names and owners).
    #[error("it is {len} bytes long, more than the {max} allowed")]
    TooLong {
        /// Its length in bytes.
        len: usize,
        /// The most bytes allowed.
        max: usize,
    },
    /// Made of whitespace only.
    #[error("it is whitespace only")]
    WhitespaceOnly,
    /// Holds a control character (NUL included) at byte offset `at`.
    #[error("it holds a control character at byte {at}")]
    ControlCharacter {
        /// Byte offset of the first control character.
        at: usize,
    },
    /// Ends with a space, which some engines' namespaces (MySQL database
    /// names) cannot hold.
    #[error("it ends with a space")]
    TrailingSpace,
    /// Holds, at byte offset `at`, a character the engine's namespace cannot
    /// hold (MySQL database names: nothing beyond U+FFFF).
    #[error("it holds a character the engine cannot store at byte {at}")]
    Unsupported {
        /// Byte offset of the first such character.
        at: usize,
    },
}

/// A lease duration (ttl) that alkstore refuses; found in the source chain of
/// [`Error::Database`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DurationError {
    /// A zero lease would expire as it is granted.
    #[error("the lease duration is zero")]
    Zero,
    /// The lease is too long to add to the clock without overflow.
    #[error("the lease duration is too large to add to the clock")]
    TooLarge,
}

/// The store was closed with [`Store::close`](crate::Store::close); found in the
/// source chain of [`Error::Database`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the store is closed")]
pub struct Closed;

/// The engine has no way to raise its fences
/// ([`Engine::raise_fences`](crate::Engine::raise_fences) was not written
/// for it); found in the source chain of [`Error::Database`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("this engine cannot raise its fences")]
pub struct RaiseUnsupported;

/// What an engine answers when no fence is left for a grant or a raise
/// (the core turns it into [`Error::FencesExhausted`]): decided before
/// anything is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "no fence left for this: {left} left below the end ({})",
    crate::MAX_FENCE
)]
pub struct NoFenceLeft {
    /// How many fences are left (0: none for a grant).
    pub left: u64,
}

/// The connection was lost while a statement that changes state ran, and
/// the try after it could not tell whether the first took effect; found in
/// the source chain of [`Error::Database`]. A release so answered may have
/// removed its grant or not: the lease ends at its TTL either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the connection was lost while the {operation} ran, and whether it took effect is unknown")]
pub struct OutcomeUnknown {
    /// The operation whose outcome is unknown.
    pub operation: &'static str,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reserved_name_says_whose_namespace_it_is_in() {
        let schema = Error::ReservedName {
            field: Field::Schema,
            name: "pg_catalog".into(),
        }
        .to_string();
        assert!(schema.contains("the database server keeps it"), "{schema}");
        let name = Error::ReservedName {
            field: Field::Name,
            name: "alkstore.x".into(),
        }
        .to_string();
        assert!(name.contains("belong to alkstore"), "{name}");
        assert!(!name.contains("database server"), "{name}");
    }

    #[test]
    fn database_error_keeps_detail_in_the_source_only() {
        let err = Error::database("renew", DurationError::Zero);
        assert_eq!(err.to_string(), "renew failed");
        let source = std::error::Error::source(&err).unwrap();
        assert_eq!(source.to_string(), "the lease duration is zero");
        assert_eq!(
            err.find_source::<DurationError>(),
            Some(&DurationError::Zero)
        );
        assert!(!err.is_closed());
        assert!(Error::closed("holder").is_closed());
    }

    #[test]
    fn invalid_name_says_which_argument_and_why() {
        let err = Error::InvalidName {
            field: Field::Owner,
            problem: NameProblem::Empty,
        };
        assert_eq!(err.to_string(), "invalid owner: it is empty");
    }
}
