//! Owner ids that name one holder.
//!
//! An owner string names one holder (one task, one job run), not a host or a
//! process: two holders that share one share its grant, and exclude nothing
//! between them. [`unique_owner`] makes an id no other holder has.

use crate::error::{Error, Result};
use crate::name::validate_owner;

/// The most bytes of the host name an owner id keeps.
const MAX_HOST_BYTES: usize = 64;

/// A fresh owner id for one holder: `label@host:pid:random`, where the
/// random part is 64 bits from the operating system, so two calls never
/// give the same id — not in one process, not across hosts. The host name
/// and process id are there for the operator reading `holder()` at 3 a.m.
///
/// Make one per holder (per task, per job run) and use it for that holder's
/// `try_lock`/`lock` calls; a new run makes a new one. An empty `label`
/// leaves out `label@`. A label that makes the id invalid as an owner
/// (control characters, more than 255 bytes in all) is refused with
/// [`Error::InvalidName`].
///
/// ```
/// use alkstore_core::unique_owner;
///
/// let a = unique_owner("nightly-report")?;
/// let b = unique_owner("nightly-report")?;
/// assert!(a.starts_with("nightly-report@"));
/// assert_ne!(a, b, "every holder gets its own id");
/// assert!(unique_owner("bad\nlabel").is_err());
/// # Ok::<(), alkstore_core::Error>(())
/// ```
pub fn unique_owner(label: &str) -> Result<String> {
    let host = gethostname::gethostname();
    let host = host.to_string_lossy();
    let host = truncate(&host, MAX_HOST_BYTES);
    let host = if host.trim().is_empty() {
        "unknown-host"
    } else {
        host
    };
    let random = getrandom::u64().map_err(|e| Error::database("unique_owner", e))?;
    let pid = std::process::id();
    let id = if label.is_empty() {
        format!("{host}:{pid}:{random:016x}")
    } else {
        format!("{label}@{host}:{pid}:{random:016x}")
    };
    validate_owner(&id)?;
    Ok(id)
}

/// The longest prefix of `text` of at most `max` bytes, on a char boundary.
fn truncate(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_differ_and_carry_the_label() {
        let ids: std::collections::HashSet<_> =
            (0..1000).map(|_| unique_owner("job").unwrap()).collect();
        assert_eq!(ids.len(), 1000);
        assert!(ids.iter().all(|id| id.starts_with("job@")));
        let bare = unique_owner("").unwrap();
        assert!(!bare.contains('@'), "{bare}");
    }

    #[test]
    fn a_label_too_long_for_an_owner_is_refused() {
        assert!(matches!(
            unique_owner(&"x".repeat(250)),
            Err(Error::InvalidName { .. })
        ));
        assert!(unique_owner(&"x".repeat(100)).is_ok());
    }

    #[test]
    fn truncation_keeps_whole_characters() {
        assert_eq!(truncate("héllo", 2), "h");
        assert_eq!(truncate("abc", 64), "abc");
    }
}
