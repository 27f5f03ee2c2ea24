//! The URLs this engine opens: `etcd://host:port[,host:port…][/prefix]`,
//! as `etcdctl --endpoints` lists members (any member answers; the
//! client moves to another when one fails). The path is the key prefix
//! the store's keys live under (default [`DEFAULT_PREFIX`]); `timeout`
//! (`?timeout=5s`, `500ms`) bounds every call. A user and password
//! (`etcd://user:password@host:2379/prefix`, percent-encoded where they
//! hold `:`, `@`, `/`, `?` or `#`) authenticate with etcd's users and roles. TLS,
//! as `etcdctl`'s flags say it: `cacert=` (the CA that signed the
//! members' certificates; without it, the system's roots and `tls=true`),
//! `cert=` and `key=` (a client certificate, for `--client-cert-auth`).

use std::path::PathBuf;
use std::time::Duration;

use alkstore_core::url::{OpenFuture, parse_duration};
use alkstore_core::{EngineDescriptor, Error, Store, UrlError};

use crate::EtcdStore;
use crate::client::{Credentials, Options, Tls};

/// The key prefix when the URL has no path.
pub const DEFAULT_PREFIX: &str = "/alkstore";

/// The etcd engine, as `alkstore::open` finds it.
pub const ENGINE: EngineDescriptor = EngineDescriptor {
    name: "etcd",
    schemes: &["etcd://"],
    open: open_url,
    inspect: crate::doctor::inspect_url,
    standby: alkstore_core::url::never_standby,
};

/// What a URL names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Parsed {
    /// The members' client endpoints, `host:port`.
    pub(crate) endpoints: Vec<String>,
    /// The key prefix, ending in `/`.
    pub(crate) prefix: String,
    /// How calls are made: their bound, the user, TLS.
    pub(crate) options: Options,
}

/// Reads `url`.
pub(crate) fn parse(url: &str) -> Result<Parsed, UrlError> {
    let malformed = |problem: &str| UrlError::malformed(url, problem);
    let rest = url
        .strip_prefix("etcd://")
        .ok_or_else(|| malformed("it does not start with etcd://"))?;
    // A user or password holding an unencoded `?` or `#` would be read as
    // the query or fragment (and then shown, in an error about them).
    let ends = rest.find(['?', '#']).unwrap_or(rest.len());
    if rest[ends..].contains('@') {
        return Err(malformed(
            "an @ after ? or #: percent-encode a ?, # or @ in the user, the password or a \
             parameter (%3F, %23, %40)",
        ));
    }
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    if rest.contains('#') {
        return Err(malformed("a fragment (#) has no meaning here"));
    }
    let (hosts, path) = match rest.find('/') {
        Some(at) => rest.split_at(at),
        None => (rest, ""),
    };
    // Likewise a password holding an unencoded `/`: the rest of it would be
    // read as the prefix (and shown, in doctor's report).
    if !hosts.contains('@') && path.contains('@') {
        return Err(malformed(
            "an @ after the hosts: percent-encode a / or @ in the user, the password or the \
             prefix (%2F, %40)",
        ));
    }
    let (credentials, hosts) = match hosts.rsplit_once('@') {
        Some((user_info, hosts)) => (Some(credentials(user_info).map_err(malformed)?), hosts),
        None => (None, hosts),
    };
    let mut endpoints = Vec::new();
    for endpoint in hosts.split(',') {
        let (host, port) = endpoint.rsplit_once(':').ok_or_else(|| {
            malformed("every endpoint needs its port (host:port, etcd's client port is 2379)")
        })?;
        if host.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0) {
            return Err(malformed(&format!("{endpoint:?} is not host:port")));
        }
        endpoints.push(endpoint.to_owned());
    }
    // Percent-decoded, as the user and password are: a `@`, `?` or `#` in
    // a prefix is written %40, %3F, %23.
    let prefix = percent_encoding::percent_decode_str(path)
        .decode_utf8()
        .map_err(|_| malformed("the prefix is not UTF-8 once percent-decoded"))?;
    let prefix = match prefix.trim_end_matches('/') {
        "" => DEFAULT_PREFIX,
        prefix => prefix,
    };
    if prefix.chars().any(char::is_control) {
        return Err(malformed("the prefix holds a control character"));
    }
    let mut timeout = crate::client::REQUEST_TIMEOUT;
    let (mut tls, mut tls_on) = (Tls::default(), None);
    let mut given: Vec<&str> = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        // Named by its key alone: a value may be a secret (a password
        // given where it does not belong).
        let key = pair.split_once('=').map_or(pair, |(key, _)| key);
        if given.contains(&key) {
            return Err(malformed(&format!("{key} given twice")));
        }
        given.push(key);
        match pair.split_once('=') {
            Some(("timeout", value)) => {
                timeout = parse_duration(value)
                    .filter(|t| !t.is_zero() && *t <= Duration::from_secs(600))
                    .ok_or_else(|| {
                        malformed("timeout is a duration from 1ms to 600s, such as 5s or 500ms")
                    })?;
            }
            Some(("tls", "true")) => tls_on = Some(true),
            Some(("tls", "false")) => tls_on = Some(false),
            Some(("tls", _)) => return Err(malformed("tls is true or false")),
            Some((file @ ("cacert" | "cert" | "key"), path)) => {
                let path = percent_encoding::percent_decode_str(path)
                    .decode_utf8()
                    .map_err(|_| malformed(&format!("{file} is not UTF-8 once percent-decoded")))?;
                if path.is_empty() {
                    return Err(malformed(&format!("{file} needs a file's path")));
                }
                let path = Some(PathBuf::from(path.as_ref()));
                match file {
                    "cacert" => tls.ca = path,
                    "cert" => tls.cert = path,
                    _ => tls.key = path,
                }
            }
            None if matches!(key, "timeout" | "tls" | "cacert" | "cert" | "key") => {
                return Err(malformed(&format!("{key} needs a value ({key}=…)")));
            }
            // Not named: a word alone may be a secret pasted in the wrong place.
            None => {
                return Err(malformed(
                    "a parameter without a value (etcd URLs know timeout, tls, cacert, cert and key)",
                ));
            }
            _ => {
                return Err(malformed(&format!(
                    "unknown parameter {key:?} (etcd URLs know timeout, tls, cacert, cert and key)"
                )));
            }
        }
    }
    if tls.cert.is_some() != tls.key.is_some() {
        return Err(malformed(
            "a client certificate needs both cert= and key= (etcdctl's --cert and --key)",
        ));
    }
    let files = tls != Tls::default();
    let tls = match (tls_on, files) {
        (Some(false), true) => {
            return Err(malformed("tls=false, but cacert, cert or key given"));
        }
        (Some(true), _) | (None, true) => Some(tls),
        _ => None,
    };
    Ok(Parsed {
        endpoints,
        prefix: format!("{prefix}/"),
        options: Options {
            timeout,
            credentials,
            tls,
        },
    })
}

/// `user:password`, each percent-decoded.
fn credentials(user_info: &str) -> Result<Credentials, &'static str> {
    let (user, password) = user_info
        .split_once(':')
        .ok_or("a user needs its password (etcd://user:password@host:2379)")?;
    let decode = |part: &str| {
        percent_encoding::percent_decode_str(part)
            .decode_utf8()
            .map(|decoded| decoded.into_owned())
            .map_err(|_| "the user or password is not UTF-8 once percent-decoded")
    };
    let (user, password) = (decode(user)?, decode(password)?);
    if user.is_empty() {
        return Err("the user before the password is empty");
    }
    Ok(Credentials { user, password })
}

fn open_url(url: &str) -> OpenFuture<'_> {
    Box::pin(async move {
        let store = EtcdStore::connect(url).await?;
        Ok(Box::new(store) as Box<dyn Store>)
    })
}

/// The URL's error as the store's `open` error.
pub(crate) fn open_error(error: UrlError) -> Error {
    Error::database("open", error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_prefix_and_timeout_are_read() {
        let parsed = parse("etcd://10.0.0.1:2379,10.0.0.2:2379/locks/prod?timeout=500ms").unwrap();
        assert_eq!(parsed.endpoints, ["10.0.0.1:2379", "10.0.0.2:2379"]);
        assert_eq!(parsed.prefix, "/locks/prod/");
        assert_eq!(parsed.options.timeout, Duration::from_millis(500));
        assert_eq!(parsed.options.tls, None);
        let plain = parse("etcd://localhost:2379").unwrap();
        assert_eq!(plain.prefix, "/alkstore/");
        assert_eq!(plain.options.timeout, crate::client::REQUEST_TIMEOUT);
        assert_eq!(parse("etcd://h:1/").unwrap().prefix, "/alkstore/");
        // Percent-decoded, as the error about an unencoded @ advises.
        let encoded = parse("etcd://u:p@h:1/team%40eu/a%3Fb%23c").unwrap();
        assert_eq!(encoded.prefix, "/team@eu/a?b#c/");
    }

    #[test]
    fn credentials_are_read_and_never_shown() {
        let parsed = parse("etcd://alk:p%40ss%3Aw@h:2379/locks").unwrap();
        let credentials = parsed.options.credentials.clone().unwrap();
        assert_eq!(
            (credentials.user.as_str(), credentials.password.as_str()),
            ("alk", "p@ss:w")
        );
        assert_eq!(parsed.endpoints, ["h:2379"]);
        assert!(!format!("{parsed:?}").contains("p@ss"));
        let refused = parse("etcd://alk:secret@h:2379?x=1")
            .unwrap_err()
            .to_string();
        assert!(!refused.contains("secret"), "{refused}");
        assert_eq!(parse("etcd://h:2379").unwrap().options.credentials, None);
    }

    #[test]
    fn tls_is_read_as_etcdctl_names_it() {
        let tls = |url: &str| parse(url).unwrap().options.tls;
        assert_eq!(tls("etcd://h:2379?tls=true"), Some(Tls::default()));
        assert_eq!(tls("etcd://h:2379?tls=false"), None);
        let full = tls("etcd://h:2379/p?cacert=/etc/ca.pem&cert=/c%20d.pem&key=k.pem").unwrap();
        assert_eq!(full.ca, Some(PathBuf::from("/etc/ca.pem")));
        assert_eq!(full.cert, Some(PathBuf::from("/c d.pem")));
        assert_eq!(full.key, Some(PathBuf::from("k.pem")));
    }

    #[test]
    fn bad_urls_are_refused_with_the_reason() {
        for (url, reason) in [
            ("etcd://host", "port"),
            ("etcd://:2379", "host:port"),
            ("etcd://h:0", "host:port"),
            ("etcd://h:x", "host:port"),
            ("etcd://u@h:2379", "password"),
            ("etcd://:secret@h:2379", "user"),
            ("etcd://u:%ff@h:2379", "UTF-8"),
            ("etcd://h:2379?timeout=0s", "timeout"),
            ("etcd://h:2379?timeout=forever", "timeout"),
            ("etcd://h:2379?user=x", "unknown parameter"),
            ("etcd://h:2379?cert=c.pem", "both cert= and key="),
            ("etcd://h:2379?key=k.pem", "both cert= and key="),
            ("etcd://h:2379?tls=false&cacert=ca.pem", "tls=false"),
            ("etcd://h:2379?tls=yes", "true or false"),
            ("etcd://alk:pa?ss@h:2379/p", "percent-encode"),
            ("etcd://alk:pa#ss@h:2379/p", "percent-encode"),
            ("etcd://alk:se/cret@h:2379", "percent-encode"),
            ("etcd://alk:2024/pw@h:2379", "percent-encode"),
            ("etcd://h:2379?cacert=", "path"),
            ("etcd://h:2379/p#x", "fragment"),
            (
                "etcd://h:2379?password=secret",
                "unknown parameter \"password\"",
            ),
            ("etcd://h:2379?token=secret", "unknown parameter \"token\""),
            ("etcd://h:2379?secret", "a parameter without a value"),
            ("etcd://h:2379?tls", "tls needs a value"),
            ("etcd://h:2379?timeout=1s&timeout=2s", "timeout given twice"),
            ("etcd://h:2379?tls=true&tls=true", "tls given twice"),
            ("etcd://h:2379?cacert=a&cacert=b", "cacert given twice"),
            ("etcd://h:2379?cert=a&key=b&cert=c", "cert given twice"),
            ("etcd://h:2379?cert=a&key=b&key=c", "key given twice"),
            ("etcd://h:2379/p%ff", "UTF-8"),
        ] {
            let error = parse(url).unwrap_err().to_string();
            assert!(error.contains(reason), "{url}: {error}");
            assert!(!error.contains("secret"), "{url}: {error}");
        }
    }
}
