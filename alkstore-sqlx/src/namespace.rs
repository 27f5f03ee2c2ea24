//! Where a store's objects live — a PostgreSQL schema, a MariaDB database —
//! which of them are there, and the refusals every sqlx engine shares about
//! them.

/// A store's namespace: its kind as the database calls it, and its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Namespace {
    /// `schema` (PostgreSQL) or `database` (MariaDB).
    pub kind: &'static str,
    /// Its name.
    pub name: String,
}

impl Namespace {
    /// A PostgreSQL schema.
    pub fn schema(name: &str) -> Self {
        Namespace {
            kind: "schema",
            name: name.to_owned(),
        }
    }

    /// A MariaDB/MySQL database.
    pub fn database(name: &str) -> Self {
        Namespace {
            kind: "database",
            name: name.to_owned(),
        }
    }
}

impl std::fmt::Display for Namespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {:?}", self.kind, self.name)
    }
}

/// The namespace holds objects with alkstore's names that alkstore did not
/// make; they are never adopted, changed or dropped.
#[derive(Debug, thiserror::Error)]
#[error(
    "{namespace} holds {what} that alkstore did not create; alkstore will not adopt or drop it \
     (choose another {kind})",
    kind = namespace.kind
)]
pub struct ForeignObjectsError {
    /// Where.
    pub namespace: Namespace,
    /// What was found.
    pub what: &'static str,
}

/// alkstore's namespace lost its `fences` sequence: a new one would hand out
/// fences from 1 again, below fences already handed out, so alkstore refuses
/// to make one, and a grant refuses to draw from none.
#[derive(Debug, thiserror::Error)]
#[error(
    "{namespace} is alkstore's but its fences sequence is gone; a new one starting at 1 would \
     hand out fences already used, so alkstore will not make one. Restore it with CREATE \
     SEQUENCE … START WITH a value above every fence ever handed out (when that is unknown: the \
     current Unix time in microseconds, above any count of grants made at under a million a \
     second). Do not drop alkstore's objects to start over: fences would restart at 1 too"
)]
pub struct LostFencesError {
    /// Where.
    pub namespace: Namespace,
}

/// Which of a store's four objects exist in its namespace (schema or
/// database), as the catalog shows them. Every sqlx engine keeps the same
/// four: a `meta` table marked as alkstore's, the `locks` table, the
/// `fences` sequence and the `acquire` routine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Objects {
    /// The `meta` table.
    pub meta: bool,
    /// The `locks` table.
    pub locks: bool,
    /// The `fences` sequence.
    pub fences: bool,
    /// The `acquire` routines (the lock's and, where the dialect has
    /// semaphores, the permit's).
    pub acquire: bool,
    /// The `permits` table.
    pub permits: bool,
}

impl Objects {
    /// All of them are there.
    pub fn all(self) -> bool {
        self.meta && self.locks && self.fences && self.acquire && self.permits
    }

    /// Any of them is there.
    pub fn any(self) -> bool {
        self.meta || self.locks || self.fences || self.acquire || self.permits
    }

    /// What an object found without `meta` is, to name it in a refusal:
    /// `None` when there is `meta`, or nothing at all.
    pub fn unmarked(self) -> Option<&'static str> {
        if self.meta {
            return None;
        }
        if self.locks {
            Some("a table named locks")
        } else if self.fences {
            Some("an object named fences")
        } else if self.acquire {
            Some("a routine named acquire")
        } else if self.permits {
            Some("a table named permits")
        } else {
            None
        }
    }
}

/// One dialect's layout of a store's objects, as its `meta` records it.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The version this build makes.
    pub version: i64,
    /// Older versions an opener upgrades in place.
    pub upgradable: std::ops::RangeInclusive<i64>,
    /// The `meta` key recording whether alkstore created the namespace (1)
    /// or found it (0): only a namespace it created is ever dropped.
    pub created_key: &'static str,
    /// Layouts from before the marker had a `schema_version` but no marker
    /// (PostgreSQL's pre-release 1): such a `meta` is named by its version,
    /// not refused as someone else's.
    pub markerless_versions: bool,
}

/// The `meta` key whose presence marks a namespace's objects as alkstore's.
pub const MARKER_KEY: &str = "made_by_alkstore";

/// What a store's `meta` says of its objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    /// alkstore created the namespace itself.
    pub created_namespace: bool,
    /// The layout version.
    pub version: i64,
}

impl Meta {
    /// Reads `meta`'s `(key, value)` rows, as the dialect's read of them
    /// answered (`unlike_ours`: the error said the columns are not
    /// alkstore's). Refuses a `meta` that is someone else's, and a version
    /// this build can neither use nor upgrade.
    pub fn read(
        namespace: &Namespace,
        layout: &Layout,
        rows: Result<Vec<(String, i64)>, sqlx::Error>,
        unlike_ours: impl Fn(&sqlx::Error) -> bool,
    ) -> Result<Meta, alkstore_core::BoxError> {
        let foreign = || ForeignObjectsError {
            namespace: namespace.clone(),
            what: "a table named meta",
        };
        let rows = rows.map_err(|error| -> alkstore_core::BoxError {
            // Columns that are not (key, value): someone else's table.
            let unlike = matches!(
                &error,
                sqlx::Error::ColumnDecode { .. } | sqlx::Error::ColumnNotFound(_)
            ) || unlike_ours(&error);
            if unlike {
                foreign().into()
            } else {
                error.into()
            }
        })?;
        let meta: std::collections::HashMap<String, i64> = rows.into_iter().collect();
        let version = meta.get("schema_version").copied();
        if !meta.contains_key(MARKER_KEY) {
            return Err(match version {
                Some(found) if layout.markerless_versions => alkstore_core::SchemaVersionError {
                    found,
                    known: layout.version,
                }
                .into(),
                _ => foreign().into(),
            });
        }
        let version = version.unwrap_or(0);
        if !layout.upgradable.contains(&version) {
            alkstore_core::SchemaVersionError::check(version, layout.version)?;
        }
        Ok(Meta {
            created_namespace: meta.get(layout.created_key) == Some(&1),
            version,
        })
    }

    /// The layout is this build's.
    pub fn current(self, layout: &Layout) -> bool {
        self.version == layout.version
    }
}

impl Namespace {
    /// Refuses objects found without `meta`: someone else's.
    pub fn refuse_unmarked(&self, objects: Objects) -> Result<(), ForeignObjectsError> {
        match objects.unmarked() {
            Some(what) => Err(self.holds_foreign(what)),
            None => Ok(()),
        }
    }

    /// The refusal of something alkstore did not make, found here.
    pub fn holds_foreign(&self, what: &'static str) -> ForeignObjectsError {
        ForeignObjectsError {
            namespace: self.clone(),
            what,
        }
    }

    /// The refusal of a namespace whose fences sequence is gone.
    pub fn lost_fences(&self) -> LostFencesError {
        LostFencesError {
            namespace: self.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_name_the_namespace_as_its_database_calls_it() {
        let foreign = ForeignObjectsError {
            namespace: Namespace::schema("locks"),
            what: "a table named locks",
        };
        assert!(
            foreign
                .to_string()
                .starts_with("schema \"locks\" holds a table named locks"),
            "{foreign}"
        );
        assert!(foreign.to_string().ends_with("(choose another schema)"));
        let lost = LostFencesError {
            namespace: Namespace::database("app"),
        };
        assert!(
            lost.to_string()
                .starts_with("database \"app\" is alkstore's but its fences sequence is gone"),
            "{lost}"
        );
    }
}
