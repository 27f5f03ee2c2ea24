//! Keeping the store URL's password out of everything printed.
//!
//! The library masks the URLs it puts in its errors, but a driver's error
//! may quote what it was given. So every line of error output goes through
//! a [`Redactor`] made from the URL the operator passed: each form of its
//! password (as typed, as the `url` crate serializes it, percent-decoded)
//! becomes `****`. The URL itself is never printed.

/// What a secret becomes.
pub const MASK: &str = "****";

/// Query parameters whose value is a secret (the ones the core masks too).
const SECRET_KEYS: [&str; 4] = ["password", "passwd", "pwd", "sslpassword"];

/// The secrets of one store URL, and their masking in any text.
///
/// No `Debug`: it holds the secrets.
#[derive(Default)]
pub struct Redactor {
    /// Every form of every secret, longest first, none empty.
    secrets: Vec<String>,
}

impl Redactor {
    /// The redactor for `url`: its password (raw and percent-decoded, from
    /// the user-info as parsed and as typed) and the values of secret
    /// query parameters. A URL without secrets gives one that changes
    /// nothing.
    pub fn for_url(url: &str) -> Self {
        let mut secrets = Vec::new();
        let mut raw = Vec::new();
        raw.extend(password(url));
        raw.extend(typed_password(url));
        raw.extend(secret_query_values(url));
        for secret in raw {
            secrets.push(percent_decode(&secret));
            secrets.push(secret);
        }
        secrets.retain(|secret| !secret.is_empty());
        // Longest first, so that no shorter form leaves part of a longer one.
        secrets.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        secrets.dedup();
        Redactor { secrets }
    }

    /// `text` with every occurrence of every secret replaced by [`MASK`].
    pub fn redact(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for secret in &self.secrets {
            if out.contains(secret.as_str()) {
                out = out.replace(secret.as_str(), MASK);
            }
        }
        out
    }
}

/// The password of `url` as the `url` crate parses it (percent-encoded, as
/// it serializes it), if the URL parses and has one.
pub fn password(url: &str) -> Option<String> {
    url::Url::parse(url).ok()?.password().map(str::to_owned)
}

/// The password as typed, found the way the core's masking finds it, so
/// that a URL the parser refuses still has its password masked: after
/// `scheme://`, before the query, the text between the first `:` of the
/// user-info and its last `@`.
fn typed_password(url: &str) -> Option<String> {
    let before_query = url.split('?').next().unwrap_or(url);
    let rest = before_query
        .split_once("://")
        .map_or(before_query, |(_, rest)| rest);
    let userinfo = &rest[..rest.rfind('@')?];
    let (_, password) = userinfo.split_once(':')?;
    Some(password.to_owned())
}

/// The values of the secret query parameters of `url`, as typed and as
/// form-decoded (`+` is a space).
fn secret_query_values(url: &str) -> Vec<String> {
    let mut found = Vec::new();
    let Some((_, query)) = url.split_once('?') else {
        return found;
    };
    let query = query.split('#').next().unwrap_or(query);
    for pair in query.split('&') {
        if let Some((key, value)) = pair.split_once('=') {
            if SECRET_KEYS.iter().any(|s| key.eq_ignore_ascii_case(s)) {
                found.push(value.to_owned());
                found.push(percent_decode(&value.replace('+', " ")));
            }
        }
    }
    found
}

/// `text` with each `%XX` escape decoded (anything else, a malformed
/// escape included, kept as it is; invalid UTF-8 replaced).
fn percent_decode(text: &str) -> String {
    fn hex(byte: Option<&u8>) -> Option<u8> {
        let digit = char::from(*byte?).to_digit(16)?;
        u8::try_from(digit).ok()
    }
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            if let (Some(high), Some(low)) = (hex(bytes.get(i + 1)), hex(bytes.get(i + 2))) {
                out.push(high * 16 + low);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_password_of_a_parsed_url() {
        assert_eq!(
            password("postgres://app:s3cret@db/app").as_deref(),
            Some("s3cret")
        );
        assert_eq!(password("postgres://app@db/app"), None);
        assert_eq!(password("sqlite://locks.db"), None);
        assert_eq!(password("not a url"), None);
    }

    #[test]
    fn every_form_of_the_password_is_masked() {
        let redactor = Redactor::for_url("postgres://app:p%40ss%2Fw0rd@db:5432/app?schema=x");
        let text = "connect p%40ss%2Fw0rd failed; p@ss/w0rd refused";
        assert_eq!(redactor.redact(text), "connect **** failed; **** refused");
    }

    #[test]
    fn an_unparsable_url_still_has_its_password_masked() {
        let redactor = Redactor::for_url("postgres://app:s3cret@db:notaport/app");
        assert_eq!(
            redactor.redact("bad port in app:s3cret@db"),
            "bad port in app:****@db"
        );
        let redactor = Redactor::for_url("postgres://app:s3cret@[::1/app");
        assert_eq!(redactor.redact("s3cret"), "****");
    }

    #[test]
    fn secret_query_parameters_are_masked() {
        let redactor = Redactor::for_url("postgres://db/app?schema=a&PassWord=top+s%65cret");
        let text = "top+s%65cret, top secret";
        assert_eq!(redactor.redact(text), "****, ****");
        assert_eq!(redactor.redact("schema a"), "schema a");
    }

    #[test]
    fn a_url_without_secrets_changes_nothing() {
        for url in ["sqlite://locks.db", "postgres://app@db/app", "", "::"] {
            let redactor = Redactor::for_url(url);
            assert_eq!(
                redactor.redact("app@db: locks.db failed"),
                "app@db: locks.db failed"
            );
        }
    }
}
