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
    /// Modes the driver does not have, and the stronger one taken instead
    /// (libpq's `allow`, which sqlx treats as `disable`, taken as `prefer`).
    pub taken_as: &'static [(&'static str, &'static str)],
    /// The mode that encrypts without verifying, and the one that verifies
    /// the CA: given a CA file, the first is raised to the second, as
    /// libpq and the `mysql` client do (the driver would ignore the file).
    pub unverified: (&'static str, &'static str),
    /// The mode that verifies the certificate and the host name.
    pub fully_verified: &'static str,
    /// The CA certificate file to verify the server's certificate with.
    pub root_cert: &'static [&'static str],
    /// The value of `root_cert` that names no file but the system's roots
    /// (libpq's `sslrootcert=system`), if the engine has one: as in libpq
    /// 16, it needs [`TlsNames::fully_verified`], the default with it.
    pub system_roots: Option<&'static str>,
    /// The client certificate file.
    pub cert: &'static [&'static str],
    /// The client certificate's key file.
    pub key: &'static [&'static str],
    /// Other TLS parameters of the engine's clients that the driver does
    /// not take: refused by name, never ignored.
    pub unsupported: &'static [&'static str],
}

impl TlsNames {
    /// Whether `key` looks like a TLS parameter (`ssl…`, `tls…`, any
    /// case): one this engine does not know is refused, not ignored.
    fn looks_like_tls(key: &str) -> bool {
        let key = key.to_ascii_lowercase();
        key.starts_with("ssl") || key.starts_with("tls")
    }
}

/// The TLS parameters one URL gives.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsParams {
    /// The mode the driver is given, spelled as in [`TlsNames::modes`]:
    /// the URL's, or the one it implies ([`TlsNames::taken_as`],
    /// [`TlsNames::unverified`], [`TlsNames::system_roots`]).
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
    /// together, no TLS parameter the driver would ignore, the system's
    /// roots only with full verification. The problem never repeats a
    /// value (a value out of place may be a secret); the URL shown masks
    /// the password.
    pub fn of(names: &TlsNames, url: &str) -> Result<TlsParams, UrlError> {
        let malformed = |problem: String| UrlError::malformed(url, problem);
        let parsed = ::url::Url::parse(url).map_err(|e| malformed(e.to_string()))?;
        let mut params = TlsParams::default();
        let kinds = [names.mode, names.root_cert, names.cert, names.key];
        let mut given = [false; 4];
        let mut system_roots = false;
        for (key, value) in parsed.query_pairs() {
            let Some(at) = kinds.iter().position(|n| n.contains(&&*key)) else {
                if TlsNames::looks_like_tls(&key) {
                    let why = match names.unsupported.contains(&&*key) {
                        true => "is not supported by this driver",
                        false => "is not a TLS parameter of this engine",
                    };
                    let known: Vec<String> = kinds.iter().map(|n| format!("`{}`", n[0])).collect();
                    return Err(malformed(format!(
                        "`{key}` {why}: its TLS parameters are {}",
                        known.join(", ")
                    )));
                }
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
                1 if file.as_deref() == names.system_roots => system_roots = true,
                1 => params.root_cert = file,
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
        if let Some((_, taken)) = names.taken_as.iter().find(|(a, _)| Some(*a) == params.mode) {
            params.mode = Some(taken);
        }
        if params.root_cert.is_some() && params.mode == Some(names.unverified.0) {
            params.mode = Some(names.unverified.1);
        }
        if system_roots {
            match params.mode {
                None => params.mode = Some(names.fully_verified),
                Some(mode) if mode == names.fully_verified => {}
                Some(_) => {
                    return Err(malformed(format!(
                        "`{}={}` needs `{}={}` (or no `{}`)",
                        names.root_cert[0],
                        names.system_roots.unwrap_or_default(),
                        names.mode[0],
                        names.fully_verified,
                        names.mode[0],
                    )));
                }
            }
        }
        Ok(params)
    }

    /// `url` as the driver takes it: its TLS parameters replaced by these
    /// (the mode implied, the system-roots value taken out: the driver
    /// trusts the system's roots always), the rest as given.
    pub fn driver_url(&self, names: &TlsNames, url: &str) -> Result<String, UrlError> {
        let mut parsed =
            ::url::Url::parse(url).map_err(|e| UrlError::malformed(url, e.to_string()))?;
        let tls = [names.mode, names.root_cert, names.cert, names.key];
        let mut kept: Vec<(String, String)> = parsed
            .query_pairs()
            .filter(|(k, _)| !tls.iter().any(|n| n.contains(&&**k)))
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        for (name, value) in [
            (names.mode[0], self.mode.map(str::to_owned)),
            (names.root_cert[0], self.root_cert.clone()),
            (names.cert[0], self.cert.clone()),
            (names.key[0], self.key.clone()),
        ] {
            if let Some(value) = value {
                kept.push((name.to_owned(), value));
            }
        }
        if kept.is_empty() {
            parsed.set_query(None);
        } else {
            parsed.query_pairs_mut().clear().extend_pairs(kept);
        }
        Ok(parsed.into())
    }

    /// Each file it names is a file that can be read, before the driver
    /// tries (which would fail only at the TLS handshake, less clearly). A
    /// file's path is shown: it is no secret, and says which one is wrong.
    pub fn check_files(&self, names: &TlsNames) -> Result<(), String> {
        for (name, path) in [
            (names.root_cert[0], &self.root_cert),
            (names.cert[0], &self.cert),
            (names.key[0], &self.key),
        ] {
            if let Some(path) = path {
                let cannot = |why: String| format!("`{name}`: cannot read {path:?}: {why}");
                let meta = std::fs::metadata(path).map_err(|e| cannot(e.to_string()))?;
                if !meta.is_file() {
                    return Err(cannot("not a file".into()));
                }
                std::fs::File::open(path).map_err(|e| cannot(e.to_string()))?;
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
        modes: &[
            "disable",
            "allow",
            "prefer",
            "require",
            "verify-ca",
            "verify-full",
        ],
        taken_as: &[("allow", "prefer")],
        unverified: ("require", "verify-ca"),
        fully_verified: "verify-full",
        root_cert: &["sslrootcert", "ssl-ca"],
        system_roots: Some("system"),
        cert: &["sslcert"],
        key: &["sslkey"],
        unsupported: &["sslpassword"],
    };

    fn mode(url: &str) -> Option<&'static str> {
        TlsParams::of(&NAMES, url).unwrap().mode
    }

    #[test]
    fn the_parameters_are_read_under_every_name() {
        let url = "postgres://db/a?ssl-mode=VERIFY-FULL&ssl-ca=%2Fca.pem&sslcert=c&sslkey=k&x=1";
        let params = TlsParams::of(&NAMES, url).unwrap();
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
            params.driver_url(&NAMES, url).unwrap(),
            "postgres://db/a?x=1&sslmode=verify-full&sslrootcert=%2Fca.pem&sslcert=c&sslkey=k"
        );
        assert_eq!(
            TlsParams::of(&NAMES, "postgres://db/a").unwrap(),
            TlsParams::default()
        );
    }

    #[test]
    fn bad_parameters_are_refused_without_their_values() {
        let refused = [
            ("sslmode=bogus", "`sslmode` is one of"),
            ("sslmode=require&ssl-mode=require", "given twice"),
            ("sslrootcert=a&ssl-ca=b", "given twice"),
            ("sslrootcert=system&sslrootcert=system", "given twice"),
            ("sslrootcert=", "names no file"),
            ("sslcert=c", "go together"),
            ("sslkey=k", "go together"),
            ("sslpassword=bogus", "`sslpassword` is not supported"),
            ("SSL_Mode=bogus", "`SSL_Mode` is not a TLS parameter"),
            ("tls=bogus", "`tls` is not a TLS parameter"),
            (
                "sslrootcert=system&sslmode=require",
                "needs `sslmode=verify-full`",
            ),
        ];
        for (query, says) in refused {
            let url = format!("postgres://u:secret@db/a?{query}");
            let err = TlsParams::of(&NAMES, &url).unwrap_err();
            let UrlError::Malformed {
                problem,
                url: shown,
            } = &err
            else {
                panic!("{url}: {err}");
            };
            assert!(problem.contains(says), "{url}: {problem}");
            assert!(!problem.contains("bogus"), "{url}: {problem}");
            assert!(!shown.contains("secret"), "{url}: {shown}");
        }
    }

    #[test]
    fn modes_are_raised_as_libpq_raises_them() {
        // The driver has no `allow`: taken as the stronger `prefer`.
        assert_eq!(mode("postgres://db/a?sslmode=allow"), Some("prefer"));
        // A CA file with `require` verifies against it.
        assert_eq!(
            mode("postgres://db/a?sslmode=require&sslrootcert=c"),
            Some("verify-ca")
        );
        assert_eq!(mode("postgres://db/a?sslmode=require"), Some("require"));
        // The system's roots: full verification, by default.
        assert_eq!(
            mode("postgres://db/a?sslrootcert=system"),
            Some("verify-full")
        );
        assert_eq!(
            mode("postgres://db/a?sslrootcert=system&sslmode=verify-full"),
            Some("verify-full")
        );
        assert_eq!(mode("postgres://db/a"), None);
    }

    #[test]
    fn the_system_roots_value_is_no_file() {
        let url = "postgres://db/a?sslrootcert=system&x=1";
        let params = TlsParams::of(&NAMES, url).unwrap();
        assert_eq!(params.root_cert, None);
        assert_eq!(
            params.driver_url(&NAMES, url).unwrap(),
            "postgres://db/a?x=1&sslmode=verify-full"
        );
    }

    #[test]
    fn unreadable_files_are_named() {
        for path in ["/no/such/ca.pem", "/"] {
            let params = TlsParams {
                root_cert: Some(path.into()),
                ..TlsParams::default()
            };
            let err = params.check_files(&NAMES).unwrap_err();
            assert!(err.contains("`sslrootcert`") && err.contains(path), "{err}");
        }
    }
}
