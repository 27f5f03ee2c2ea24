//! Semaphores: what a permit is, how many a name may have, and the check
//! every permit request passes before it touches storage.

use crate::error::{Error, Result};

/// The most permits one semaphore may have: 1000. Engines keep a row per
/// live permit and look for a free slot among `0..permits` on each acquire,
/// so the bound keeps an acquire's work, and a page of
/// [`Store::list`](crate::Store::list), affordable.
pub const MAX_PERMITS: u32 = 1000;

/// Which permit of a semaphore a grant holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PermitSlot {
    /// The permit's slot, `0..permits`: a resource that checks fences per
    /// slot keeps one highest fence per slot.
    pub slot: u32,
    /// How many permits the semaphore has.
    pub permits: u32,
}

/// What a name is held as, when a request asked for the other kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeldAs {
    /// A plain lock holds the name.
    Lock,
    /// Live permits of a semaphore of `permits` permits hold the name.
    Semaphore {
        /// The semaphore's permits.
        permits: u32,
    },
    /// Live grants of a reader-writer lock (readers or its writer) hold the
    /// name, or a waiting writer's intent does.
    ReadWrite,
}

impl HeldAs {
    /// What the live rows of a permits table hold a name as, by their
    /// permits column: a reader-writer lock's rows carry
    /// [`READ_WRITE_PERMITS`](crate::READ_WRITE_PERMITS), a semaphore's its
    /// permits.
    pub fn of_permits_column(permits: u32) -> HeldAs {
        match permits {
            crate::READ_WRITE_PERMITS => HeldAs::ReadWrite,
            permits => HeldAs::Semaphore { permits },
        }
    }
}

impl std::fmt::Display for HeldAs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HeldAs::Lock => f.write_str("a lock"),
            HeldAs::Semaphore { permits } => write!(f, "a semaphore of {permits} permits"),
            HeldAs::ReadWrite => f.write_str("a reader-writer lock"),
        }
    }
}

/// The engine has no semaphores ([`Engine::acquire_permit`](crate::Engine::acquire_permit)
/// was not written for it); found in the source chain of
/// [`Error::Database`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("this engine has no semaphores")]
pub struct PermitsUnsupported;

/// `Ok` when a semaphore may have `permits` permits: 1 to [`MAX_PERMITS`].
pub fn validate_permits(permits: u32) -> Result<()> {
    if (1..=MAX_PERMITS).contains(&permits) {
        Ok(())
    } else {
        Err(Error::InvalidPermits {
            permits,
            max: MAX_PERMITS,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permits_are_one_to_the_bound() {
        assert!(validate_permits(1).is_ok());
        assert!(validate_permits(MAX_PERMITS).is_ok());
        for permits in [0, MAX_PERMITS + 1, u32::MAX] {
            let err = validate_permits(permits).unwrap_err();
            assert!(
                matches!(err, Error::InvalidPermits { permits: p, max: MAX_PERMITS } if p == permits),
                "{err:?}"
            );
        }
    }

    #[test]
    fn a_clash_names_what_holds_the_name() {
        assert_eq!(HeldAs::Lock.to_string(), "a lock");
        assert_eq!(
            HeldAs::Semaphore { permits: 3 }.to_string(),
            "a semaphore of 3 permits"
        );
        assert_eq!(HeldAs::ReadWrite.to_string(), "a reader-writer lock");
        assert_eq!(HeldAs::of_permits_column(0), HeldAs::ReadWrite);
        assert_eq!(
            HeldAs::of_permits_column(2),
            HeldAs::Semaphore { permits: 2 }
        );
    }
}
