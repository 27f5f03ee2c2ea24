//! Reader-writer locks: many readers or one writer on a name, and a
//! waiting writer's intent that holds new readers back.
//!
//! A reader-writer lock is built on the semaphore's rows: every engine in
//! this workspace keeps its grants beside a semaphore's permits, marked
//! with [`READ_WRITE_PERMITS`] in the permits column, each reader on a slot
//! of its own (`0..`[`MAX_READERS`]), the writer on [`WRITER_SLOT`] and a
//! waiting writer's intent on [`INTENT_SLOT`]. A lock, a semaphore and a
//! reader-writer lock never hold one name at once.

use crate::permit::PermitSlot;

/// The most readers one name may have at once: 1000. A reader beyond it
/// waits as for a writer (its attempt is refused). Each reader has a row
/// and a slot, as a permit has, so the bound keeps an acquire's look for a
/// free slot, and a page of [`Store::list`](crate::Store::list), affordable.
pub const MAX_READERS: u32 = crate::MAX_PERMITS;

/// The value of a permits column that marks a reader-writer lock's row
/// (a semaphore has 1 to [`MAX_PERMITS`](crate::MAX_PERMITS) permits, so
/// the two never mix).
pub const READ_WRITE_PERMITS: u32 = 0;

/// The slot of a reader-writer lock's writer, among its readers' slots.
pub const WRITER_SLOT: i64 = -1;

/// The slot of a waiting writer's intent: not a grant (its fence is 0),
/// only a row that refuses new readers until it lapses or its writer is
/// granted.
pub const INTENT_SLOT: i64 = -2;

/// The longest a waiting writer's intent lasts from one attempt (the
/// lesser of this, its ttl and its wait left). A waiting writer attempts
/// far more often (at least every poll ceiling, and before half its intent
/// has passed), so this only bounds how long the intent of a writer that
/// crashed while it waited holds readers back, whatever its ttl.
pub const MAX_INTENT: std::time::Duration = std::time::Duration::from_secs(5);

/// What a reader-writer acquire asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RwMode {
    /// A share of the name beside other readers.
    Read,
    /// The name alone.
    Write,
}

/// How a reader-writer lock's grant holds its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    /// One of the readers, on its own slot (readers of one name have
    /// distinct slots, the lowest free one first).
    Read {
        /// The reader's slot, `0..`[`MAX_READERS`].
        slot: u32,
    },
    /// The writer.
    Write,
}

impl Access {
    /// The mode a grant of this access was asked with.
    pub fn mode(self) -> RwMode {
        match self {
            Access::Read { .. } => RwMode::Read,
            Access::Write => RwMode::Write,
        }
    }

    /// The grant's slot in the permits table ([`WRITER_SLOT`] for the writer).
    pub fn row_slot(self) -> i64 {
        match self {
            Access::Read { slot } => i64::from(slot),
            Access::Write => WRITER_SLOT,
        }
    }

    /// The access a row of a reader-writer lock in slot `slot` holds:
    /// `None` for an intent (or any slot no grant has).
    pub fn of_row_slot(slot: i64) -> Option<Access> {
        match slot {
            WRITER_SLOT => Some(Access::Write),
            _ => u32::try_from(slot)
                .ok()
                .filter(|&slot| slot < MAX_READERS)
                .map(|slot| Access::Read { slot }),
        }
    }
}

impl std::fmt::Display for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Access::Read { .. } => f.write_str("read"),
            Access::Write => f.write_str("write"),
        }
    }
}

/// What a live row of a permits table (a semaphore's permits beside
/// reader-writer locks' rows) holds, by its slot and permits columns: a
/// permit, a reader-writer access, or neither (an intent, or a row no
/// engine writes).
pub fn permits_row_kind(slot: i64, permits: u32) -> (Option<PermitSlot>, Option<Access>) {
    match permits {
        READ_WRITE_PERMITS => (None, Access::of_row_slot(slot)),
        permits => {
            let permit = u32::try_from(slot)
                .ok()
                .filter(|&slot| slot < permits)
                .map(|slot| PermitSlot { slot, permits });
            (permit, None)
        }
    }
}

/// The engine has no reader-writer locks
/// ([`Engine::acquire_rw`](crate::Engine::acquire_rw) was not written for
/// it); found in the source chain of [`Error::Database`](crate::Error::Database).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("this engine has no reader-writer locks")]
pub struct RwUnsupported;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_slots_round_trip() {
        for access in [
            Access::Write,
            Access::Read { slot: 0 },
            Access::Read {
                slot: MAX_READERS - 1,
            },
        ] {
            assert_eq!(Access::of_row_slot(access.row_slot()), Some(access));
        }
        for slot in [INTENT_SLOT, i64::from(MAX_READERS), -3, i64::MAX] {
            assert_eq!(Access::of_row_slot(slot), None, "slot {slot}");
        }
        assert_eq!(Access::Read { slot: 4 }.mode(), RwMode::Read);
        assert_eq!(Access::Write.to_string(), "write");
    }

    #[test]
    fn rows_of_a_permits_table_say_what_they_hold() {
        let permit = PermitSlot {
            slot: 2,
            permits: 3,
        };
        assert_eq!(permits_row_kind(2, 3), (Some(permit), None));
        assert_eq!(permits_row_kind(3, 3), (None, None), "no such slot");
        assert_eq!(permits_row_kind(-1, 0), (None, Some(Access::Write)));
        assert_eq!(
            permits_row_kind(7, 0),
            (None, Some(Access::Read { slot: 7 }))
        );
        assert_eq!(permits_row_kind(INTENT_SLOT, 0), (None, None));
    }
}
