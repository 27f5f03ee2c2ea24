//! Store URLs: the error every engine reports for one it cannot use, the
//! password masking those errors go through, and the descriptor by which an
//! engine tells `alkstore::open` which URLs are its own.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::error::Result;
use crate::store::Store;

/// A store URL that could not be used; found in the source chain of the
/// [`Error::Database`](crate::Error::Database) `open` returns. Every URL in
/// it is [`masked`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UrlError {
    /// No engine of this build opens URLs of this form.
    #[error(
        "unsupported store URL {url:?}: this build opens {known} \
         (other engines need their feature of the alkstore crate turned on)"
    )]
    UnknownScheme {
        /// The URL as given, with any password masked.
        url: String,
        /// The URL forms this build opens.
        known: String,
    },
    /// The form is known but malformed.
    #[error("malformed store URL {url:?}: {problem}")]
    Malformed {
        /// The URL as given, with any password masked.
        url: String,
        /// What is wrong with it.
        problem: String,
    },
}

impl UrlError {
    /// `url` (masked here) is malformed because of `problem`.
    pub fn malformed(url: &str, problem: impl Into<String>) -> Self {
        UrlError::Malformed {
            url: masked(url),
            problem: problem.into(),
        }
    }
}

/// The future of [`EngineDescriptor::open`].
pub type OpenFuture<'a> = Pin<Box<dyn Future<Output = Result<Box<dyn Store>>> + Send + 'a>>;

/// What `alkstore::open` knows of an engine: its name (its feature and
/// its name in `ALKSTORE_REQUIRE`), the URL prefixes it owns, and how it
/// opens a store from such a URL. Each engine crate exports one as `ENGINE`.
#[derive(Clone, Copy)]
pub struct EngineDescriptor {
    /// The engine's name: `sqlite`, `postgres`, `mysql`.
    pub name: &'static str,
    /// The URL prefixes this engine opens, such as `"postgres://"`.
    pub schemes: &'static [&'static str],
    /// Opens the store `url` names. A URL this engine cannot use is an
    /// [`Error::Database`](crate::Error::Database) with a [`UrlError`]
    /// source, and nothing is opened.
    pub open: for<'a> fn(&'a str) -> OpenFuture<'a>,
    /// Reads the durability and replication settings of the deployment
    /// `url` names and judges the contract's promises by them
    /// ([`doctor`](crate::doctor)), without opening a store: nothing is
    /// created.
    pub inspect: for<'a> fn(&'a str) -> crate::doctor::InspectFuture<'a>,
    /// Whether the server `url` names is a standby (read-only, in
    /// recovery), by one short read: what `alkstore list`, `show` and
    /// `watch` warn of. [`never_standby`] for an engine without standbys.
    pub standby: for<'a> fn(&'a str) -> StandbyFuture<'a>,
}

/// The future of [`EngineDescriptor::standby`].
pub type StandbyFuture<'a> = Pin<Box<dyn Future<Output = Result<bool>> + Send + 'a>>;

/// [`EngineDescriptor::standby`] of an engine that has no standbys.
pub fn never_standby(_url: &str) -> StandbyFuture<'_> {
    Box::pin(async { Ok(false) })
}

impl EngineDescriptor {
    /// Whether `url` starts with one of this engine's schemes.
    pub fn handles(&self, url: &str) -> bool {
        self.schemes.iter().any(|scheme| url.starts_with(scheme))
    }
}

impl std::fmt::Debug for EngineDescriptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineDescriptor")
            .field("name", &self.name)
            .field("schemes", &self.schemes)
            .finish_non_exhaustive()
    }
}

/// Opens `url` with the first of `engines` that handles it; an
/// [`UrlError::UnknownScheme`] naming every form they know when none does.
pub async fn open_with(engines: &[&EngineDescriptor], url: &str) -> Result<Box<dyn Store>> {
    (engine_for(engines, url, "open")?.open)(url).await
}

/// Whether the server `url` names is a standby ([`EngineDescriptor::standby`]),
/// with the first of `engines` that handles it.
pub async fn standby_with(engines: &[&EngineDescriptor], url: &str) -> Result<bool> {
    (engine_for(engines, url, "standby")?.standby)(url).await
}

/// Inspects the deployment `url` names ([`EngineDescriptor::inspect`]) with
/// the first of `engines` that handles it; an [`UrlError::UnknownScheme`]
/// when none does.
pub async fn inspect_with(
    engines: &[&EngineDescriptor],
    url: &str,
) -> Result<crate::doctor::Report> {
    (engine_for(engines, url, "inspect")?.inspect)(url).await
}

/// The first of `engines` that handles `url`.
fn engine_for<'e>(
    engines: &[&'e EngineDescriptor],
    url: &str,
    operation: &'static str,
) -> Result<&'e EngineDescriptor> {
    match engines.iter().find(|engine| engine.handles(url)) {
        Some(engine) => Ok(engine),
        None => {
            let known: Vec<String> = engines
                .iter()
                .flat_map(|e| e.schemes.iter().map(|s| format!("{s}…")))
                .collect();
            Err(crate::Error::database(
                operation,
                UrlError::UnknownScheme {
                    url: masked(url),
                    known: if known.is_empty() {
                        "no URLs".to_owned()
                    } else {
                        known.join(", ")
                    },
                },
            ))
        }
    }
}

/// A URL parameter's duration, as `timeout=5s` or `timeout=500ms` say it:
/// whole seconds or milliseconds; `None` for anything else.
///
/// ```
/// use std::time::Duration;
/// use alkstore_core::url::parse_duration;
/// assert_eq!(parse_duration("5s"), Some(Duration::from_secs(5)));
/// assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
/// assert_eq!(parse_duration("5"), None);
/// ```
pub fn parse_duration(value: &str) -> Option<Duration> {
    if let Some(ms) = value.strip_suffix("ms") {
        return ms.parse().ok().map(Duration::from_millis);
    }
    value
        .strip_suffix('s')?
        .parse()
        .ok()
        .map(Duration::from_secs)
}

/// Query parameters whose value is shown: alkstore's own and the drivers'
/// that name no secret (a mode, a file's path, a host). Every other
/// value — a password, a token, a parameter nobody knows — is masked.
const SHOWN_KEYS: [&str; 27] = [
    "schema",
    "pooler",
    "listen",
    "timeout",
    "tls",
    "cacert",
    "cert",
    "key",
    "mode",
    "cache",
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "ssl-mode",
    "ssl-ca",
    "ssl-cert",
    "ssl-key",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "application_name",
    "statement-cache-capacity",
    "charset",
    "socket",
];

/// The URL with every secret replaced by `****`, parsed or not: the
/// password of the user-info (everything between the first `:` after the
/// scheme and the last `@` before the query, so that a password holding
/// `/`, `@` or `:` is masked whole; with an `@` after the first `?` or `#`,
/// the last `@` anywhere, so that one holding an unencoded `?` or `#` is
/// too — more is masked than needed rather than less) and the value of
/// every query parameter but those known to name no secret (a parameter
/// without a value is masked whole: it may be a secret pasted in the
/// wrong place).
pub fn masked(url: &str) -> String {
    let (prefix, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (format!("{scheme}://"), rest),
        None => (String::new(), url),
    };
    let head_end = rest.find(['?', '#']).unwrap_or(rest.len());
    let at = match rest[head_end..].contains('@') {
        true => rest.rfind('@'),
        false => rest[..head_end].rfind('@'),
    };
    let mut out = prefix;
    let tail = match at {
        Some(at) => {
            let userinfo = &rest[..at];
            let user = userinfo.split(':').next().unwrap_or_default();
            let password = if userinfo.contains(':') { ":****" } else { "" };
            out += &format!("{user}{password}@");
            &rest[at + 1..]
        }
        None => rest,
    };
    let (before_query, query) = match tail.split_once('?') {
        Some((head, query)) => (head, Some(query)),
        None => (tail, None),
    };
    out += before_query;
    if let Some(query) = query {
        let pairs: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((key, _)) if SHOWN_KEYS.iter().any(|s| key.eq_ignore_ascii_case(s)) => {
                    pair.to_owned()
                }
                Some((key, _)) => format!("{key}=****"),
                None if pair.is_empty() => String::new(),
                None => "****".to_owned(),
            })
            .collect();
        out.push('?');
        out.push_str(&pairs.join("&"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masking_hides_every_password() {
        assert_eq!(
            masked("postgres://u:p@h/db?sslmode=disable&password=x"),
            "postgres://u:****@h/db?sslmode=disable&password=****"
        );
        for url in [
            "redis://user:secret@host/0",
            "postgres://user:sec/ret@host/db?port=x",
            "postgres://user:se@cret@/db",
            "postgres://host/db?PassWord=secret",
            "mysql://u:secret@h?pwd=secret",
            "etcd://alk:pa?secret@h:2379/locks?timeout=1s",
            "etcd://alk:pa#secret@h:2379/locks",
            "etcd://alk:pa@ss?secret@h:2379/locks",
            "postgres://u:se@cr?secret@h/db",
            "etcd://alk:se/secret@h:2379",
        ] {
            assert!(!masked(url).contains("secret"), "{url}: {}", masked(url));
        }
        assert_eq!(
            masked("etcd://alk:pa?secret@h:2379/locks?timeout=1s&password=x"),
            "etcd://alk:****@h:2379/locks?timeout=1s&password=****"
        );
        assert_eq!(masked("sqlite://a.db?mode=ro"), "sqlite://a.db?mode=ro");
        // Any parameter not known to be harmless: its value, or a word alone.
        assert_eq!(
            masked("etcd://h:1/p?token=secret&timeout=1s&secret"),
            "etcd://h:1/p?token=****&timeout=1s&****"
        );
        assert_eq!(
            masked("postgres://h/db?schema=a&sslmode=verify-full&api_key=secret"),
            "postgres://h/db?schema=a&sslmode=verify-full&api_key=****"
        );
    }
}
