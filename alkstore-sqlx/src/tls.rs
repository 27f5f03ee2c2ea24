//! The TLS parameters of a PostgreSQL or MariaDB/MySQL URL, under the
//! names each server's own clients give them (libpq's `sslmode`, the
//! `mysql` client's `ssl-mode`): checked before anything connects, then
//! handed to the driver, which makes the connection (rustls; the system's
//! root certificates and the URL's CA file both trusted).

use alkstore_core::UrlError;

/// How one engine's URLs name their TLS parameters: the first name of each
/// is its own clients'; the others are the driver's aliases, taken as the
/// same parameter (given under two names, it is given twice).
#[derive(Debug, Clone, Copy)]
pub struct TlsNames {
    /// The mode: whether to encrypt and what to verify.
    pub mode: &'static [&'static str],
    /// The mode's values, weakest first (any ASCII case is taken).
    pub modes: &'static [&'static str],
    /// The CA certificate file to verify the server's certificate with.
    pub root_cert: &'static [&'static str],
    /// The value of `root_cert` that names no file but the system's roots
    /// (libpq's `sslrootcert=system`), if the engine has one.
    pub system_roots: Option<&'static str>,
    /// The client certificate file.
    pub cert: &'static [&'static str],
    /// The client certificate's key file.
    pub key: &'static [&'static str],
}

/// The TLS parameters one URL gives.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsParams {
    /// The mode, spelled as in [`TlsNames::modes`].
    pub mode: Option<&'static str>,
    /// The CA file (never the system-roots value).
    pub root_cert: Option<String>,
    /// The client certificate file.
    pub cert: Option<String>,
    /// The client key file.
    pub key: Option<String>,
}

impl TlsParams {
    /// The TLS parameters of `url`, checked: each given once, a mode among
    /// `names.modes`, no empty file name, a client certificate and its key
    /// together. Errors never repeat a mode's value (a value out of place
    /// may be a secret) and mask the URL's password.
    pub fn of(names: &TlsNames, url: &str) -> Result<TlsParams, UrlError> {
        let malformed = |problem: String| UrlError::malformed(url, problem);
        let parsed = ::url::Url::parse(url).map_err(|e| malformed(e.to_string()))?;
        let mut params = TlsParams::default();
        let kinds = [names.mode, names.root_cert, names.cert, names.key];
        let mut given = [false; 4];
        for (key, value) in parsed.query_pairs() {
            let Some(at) = kinds.iter().position(|n| n.contains(&&*key)) else {
                continue;
            };
            let name = kinds[at][0];
            if std::mem::replace(&mut given[at], true) {
                return Err(malformed(format!("`{name}` given twice")));
            }
            if at == 0 {
                let mode = names.modes.iter().find(|m| m.eq_ignore_ascii_case(&value));
                params.mode = Some(*mode.ok_or_else(|| {
                    malformed(format!("`{name}` is one of {}", names.modes.join(", ")))
                })?);
                continue;
            }
            if value.is_empty() {
                return Err(malformed(format!("`{name}` names no file")));
            }
            let file = Some(value.into_owned());
            match at {
                1 => params.root_cert = file.filter(|f| Some(f.as_str()) != names.system_roots),
                2 => params.cert = file,
                _ => params.key = file,
            }
        }
        if params.cert.is_some() != params.key.is_some() {
            return Err(malformed(format!(
                "`{}` and `{}` go together: a client certificate and its key",
                names.cert[0], names.key[0]
            )));
        }
        Ok(params)
    }

    /// `url` as the driver takes it: with the system-roots value of the
    /// CA parameter taken out (the driver trusts the system's roots always).
    pub fn driver_url(names: &TlsNames, url: &str) -> Result<String, UrlError> {
        let Some(system) = names.system_roots else {
            return Ok(url.to_owned());
        };
        let mut parsed =
            ::url::Url::parse(url).map_err(|e| UrlError::malformed(url, e.to_string()))?;
        let kept: Vec<(String, String)> = parsed
            .query_pairs()
            .filter(|(k, v)| !(names.root_cert.contains(&&**k) && v == system))
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        if kept.len() == parsed.query_pairs().count() {
            return Ok(url.to_owned());
        }
        if kept.is_empty() {
            parsed.set_query(None);
        } else {
            parsed.query_pairs_mut().clear().extend_pairs(kept);
        }
        Ok(parsed.into())
    }

    /// Each file it names can be read, before the driver tries (which
    /// would fail only at the TLS handshake, less clearly). A file's path
    /// is shown: it is no secret, and says which one is wrong.
    pub fn check_files(&self, names: &TlsNames) -> Result<(), String> {
        for (name, path) in [
            (names.root_cert[0], &self.root_cert),
            (names.cert[0], &self.cert),
            (names.key[0], &self.key),
        ] {
            if let Some(path) = path {
                std::fs::File::open(path)
                    .map_err(|e| format!("`{name}`: cannot read {path:?}: {e}"))?;
            }
        }
        Ok(())
    }
}

/// What a connection's TLS mode asks for, whatever the engine calls it:
/// what `alkstore doctor` reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsLevel {
    /// Never encrypted (`disable`, `DISABLED`).
    Off,
    /// Encrypted if the server offers it, the certificate not verified
    /// (`allow`, `prefer`, `PREFERRED`): a man in the middle can read it.
    IfOffered,
    /// Encrypted or refused, the certificate not verified (`require`,
    /// `REQUIRED`).
    Unverified,
    /// Encrypted, the certificate verified against the CA, the host name
    /// not checked (`verify-ca`, `VERIFY_CA`). The driver trusts the
    /// system's roots as well as the URL's CA: any certificate they signed,
    /// for any host, passes.
    CaVerified,
    /// Encrypted, the certificate and the host name verified
    /// (`verify-full`, `VERIFY_IDENTITY`).
    FullyVerified,
}

impl std::fmt::Display for TlsLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TlsLevel::Off => "never encrypted",
            TlsLevel::IfOffered => {
                "encrypted if the server offers it, the server's certificate not verified"
            }
            TlsLevel::Unverified => "encrypted or refused, the server's certificate not verified",
            TlsLevel::CaVerified => {
                "encrypted or refused, the server's certificate verified against the CA \
                 (its host name not checked)"
            }
            TlsLevel::FullyVerified => {
                "encrypted or refused, the server's certificate and host name verified"
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAMES: TlsNames = TlsNames {
        mode: &["sslmode", "ssl-mode"],
        modes: &["disable", "prefer", "require", "verify-full"],
        root_cert: &["sslrootcert", "ssl-ca"],
        system_roots: Some("system"),
        cert: &["sslcert"],
        key: &["sslkey"],
    };

    #[test]
    fn the_parameters_are_read_under_every_name() {
        let params = TlsParams::of(
            &NAMES,
            "postgres://db/a?ssl-mode=VERIFY-FULL&ssl-ca=%2Fca.pem&sslcert=c&sslkey=k&other=x",
        )
        .unwrap();
        assert_eq!(
            params,
            TlsParams {
                mode: Some("verify-full"),
                root_cert: Some("/ca.pem".into()),
                cert: Some("c".into()),
                key: Some("k".into()),
            }
        );
        assert_eq!(
            TlsParams::of(&NAMES, "postgres://db/a").unwrap(),
            TlsParams::default()
        );
    }

    #[test]
    fn bad_parameters_are_refused_without_their_values() {
        for (url, says) in [
            (
                "postgres://u:secret@db/a?sslmode=bogus",
                "`sslmode` is one of",
            ),
            (
                "postgres://u:secret@db/a?sslmode=require&ssl-mode=require",
                "given twice",
            ),
            (
                "postgres://u:secret@db/a?sslrootcert=a&ssl-ca=b",
                "given twice",
            ),
            (
                "postgres://u:secret@db/a?sslrootcert=system&sslrootcert=system",
                "given twice",
            ),
            ("postgres://u:secret@db/a?sslrootcert=", "names no file"),
            ("postgres://u:secret@db/a?sslcert=c", "go together"),
            ("postgres://u:secret@db/a?sslkey=k", "go together"),
        ] {
            let err = TlsParams::of(&NAMES, url).unwrap_err().to_string();
            assert!(err.contains(says), "{url}: {err}");
            assert!(!err.contains("secret"), "{url}: {err}");
        }
    }

    #[test]
    fn the_system_roots_value_is_no_file() {
        let url = "postgres://db/a?sslmode=verify-full&sslrootcert=system&x=1";
        assert_eq!(TlsParams::of(&NAMES, url).unwrap().root_cert, None);
        assert_eq!(
            TlsParams::driver_url(&NAMES, url).unwrap(),
            "postgres://db/a?sslmode=verify-full&x=1"
        );
        let kept = "postgres://db/a?sslrootcert=%2Fca.pem";
        assert_eq!(TlsParams::driver_url(&NAMES, kept).unwrap(), kept);
    }

    #[test]
    fn unreadable_files_are_named() {
        let params = TlsParams {
            root_cert: Some("/no/such/ca.pem".into()),
            ..TlsParams::default()
        };
        let err = params.check_files(&NAMES).unwrap_err();
        assert!(
            err.contains("`sslrootcert`") && err.contains("/no/such/ca.pem"),
            "{err}"
        );
    }
}
