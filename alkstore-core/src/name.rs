//! Validation of lock names and owners, shared by every engine.
//!
//! Both are checked before any round trip, so a rejected call leaves nothing
//! behind in storage.

use crate::error::{Error, Field, NameProblem, Result};

/// The most bytes of UTF-8 a lock name or an owner may hold.
pub const MAX_NAME_BYTES: usize = 255;

/// Lock names starting with this prefix are reserved for alkstore itself.
pub const RESERVED_PREFIX: &str = "alkstore.";

/// Checks a lock name: the shared character rules, then the reserved prefix.
///
/// ```
/// use alkstore_core::{validate_name, Error};
/// assert!(validate_name("nightly-report").is_ok());
/// assert!(matches!(validate_name(""), Err(Error::InvalidName { .. })));
/// assert!(matches!(validate_name("alkstore.internal"), Err(Error::ReservedName { .. })));
/// ```
pub fn validate_name(name: &str) -> Result<()> {
    check_text(name, MAX_NAME_BYTES).map_err(|problem| Error::InvalidName {
        field: Field::Name,
        problem,
    })?;
    if name.starts_with(RESERVED_PREFIX) {
        return Err(Error::ReservedName {
            field: Field::Name,
            name: name.to_owned(),
        });
    }
    Ok(())
}

/// Checks an owner: the same character rules as a name, without the reserved prefix.
///
/// ```
/// use alkstore_core::{validate_owner, Error, Field};
/// assert!(validate_owner("host-a:4711").is_ok());
/// assert!(matches!(
///     validate_owner("   "),
///     Err(Error::InvalidName { field: Field::Owner, .. })
/// ));
/// ```
pub fn validate_owner(owner: &str) -> Result<()> {
    check_text(owner, MAX_NAME_BYTES).map_err(|problem| Error::InvalidName {
        field: Field::Owner,
        problem,
    })
}

/// Checks a listing's name prefix and the name it starts after: the empty
/// prefix lists every name; otherwise the character rules of a name, except
/// that a prefix may be whitespace only (a name may start with spaces).
///
/// ```
/// use alkstore_core::{validate_listing, Error, Field};
/// assert!(validate_listing("", None).is_ok());
/// assert!(validate_listing("jobs/", Some("jobs/17")).is_ok());
/// assert!(matches!(
///     validate_listing("jobs\n", None),
///     Err(Error::InvalidName { field: Field::Prefix, .. })
/// ));
/// ```
pub fn validate_listing(prefix: &str, after: Option<&str>) -> Result<()> {
    if !prefix.is_empty() {
        match check_text(prefix, MAX_NAME_BYTES) {
            Ok(()) | Err(NameProblem::WhitespaceOnly) => {}
            Err(problem) => {
                return Err(Error::InvalidName {
                    field: Field::Prefix,
                    problem,
                });
            }
        }
    }
    if let Some(after) = after {
        check_text(after, MAX_NAME_BYTES).map_err(|problem| Error::InvalidName {
            field: Field::Name,
            problem,
        })?;
    }
    Ok(())
}

/// Checks the shared character rules with a byte limit of `max`: 1 to `max`
/// bytes, not whitespace only, no control characters. Engines use it for
/// their own namespaces (a PostgreSQL schema name allows 63 bytes).
pub fn check_text(text: &str, max: usize) -> std::result::Result<(), NameProblem> {
    if text.is_empty() {
        return Err(NameProblem::Empty);
    }
    if text.len() > max {
        return Err(NameProblem::TooLong {
            len: text.len(),
            max,
        });
    }
    if let Some((at, _)) = text.char_indices().find(|(_, c)| c.is_control()) {
        return Err(NameProblem::ControlCharacter { at });
    }
    if text.chars().all(char::is_whitespace) {
        return Err(NameProblem::WhitespaceOnly);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn problem(name: &str) -> Option<NameProblem> {
        match validate_name(name) {
            Ok(()) => None,
            Err(Error::InvalidName { problem, field }) => {
                assert_eq!(field, Field::Name);
                Some(problem)
            }
            Err(other) => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn each_rule_rejects_with_its_own_reason() {
        assert_eq!(problem(""), Some(NameProblem::Empty));
        assert_eq!(
            problem(" \t\u{3000}"),
            Some(NameProblem::ControlCharacter { at: 1 })
        );
        assert_eq!(problem("  \u{3000} "), Some(NameProblem::WhitespaceOnly));
        assert_eq!(
            problem("a\0b"),
            Some(NameProblem::ControlCharacter { at: 1 })
        );
        assert_eq!(
            problem("ab\u{7f}"),
            Some(NameProblem::ControlCharacter { at: 2 })
        );
        assert_eq!(
            problem("x\ny"),
            Some(NameProblem::ControlCharacter { at: 1 })
        );
        assert_eq!(
            problem(&"a".repeat(256)),
            Some(NameProblem::TooLong { len: 256, max: 255 })
        );
        assert_eq!(problem(&"a".repeat(255)), None);
        // 85 three-byte characters are 255 bytes; one more is 258.
        assert_eq!(problem(&"€".repeat(85)), None);
        assert_eq!(
            problem(&"€".repeat(86)),
            Some(NameProblem::TooLong { len: 258, max: 255 })
        );
        assert_eq!(problem(" padded name "), None);
    }

    #[test]
    fn reserved_prefix_applies_to_names_not_owners() {
        assert!(matches!(
            validate_name("alkstore.leader"),
            Err(Error::ReservedName { name, .. }) if name == "alkstore.leader"
        ));
        assert!(validate_name("alkstore").is_ok());
        assert!(validate_name("Alkstore.leader").is_ok());
        assert!(validate_owner("alkstore.leader").is_ok());
    }

    #[test]
    fn owner_errors_name_the_owner() {
        let err = validate_owner("").unwrap_err();
        assert_eq!(err.to_string(), "invalid owner: it is empty");
    }

    /// The rule written independently of `check`, as the property's oracle.
    fn acceptable(s: &str) -> bool {
        (1..=255).contains(&s.len())
            && !s.chars().any(|c| c.is_control())
            && s.chars().any(|c| !c.is_whitespace())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn any_string_gets_the_rule_and_no_panic(s in "\\PC{0,3}[\\s\\x00-\\x1f\\x7f]{0,2}\\PC{0,300}") {
            let accepted_owner = validate_owner(&s).is_ok();
            prop_assert_eq!(accepted_owner, acceptable(&s));
            match validate_name(&s) {
                Ok(()) => prop_assert!(acceptable(&s) && !s.starts_with(RESERVED_PREFIX)),
                Err(Error::ReservedName { .. }) => prop_assert!(acceptable(&s) && s.starts_with(RESERVED_PREFIX)),
                Err(Error::InvalidName { .. }) => prop_assert!(!acceptable(&s)),
                Err(other) => prop_assert!(false, "unexpected {:?}", other),
            }
        }

        #[test]
        fn arbitrary_unicode_never_panics(s in any::<String>()) {
            let _ = validate_name(&s);
            let _ = validate_owner(&s);
        }
    }
}
