//! PgBouncer in front of the test server ([`crate::pg::server`]), started
//! from the installed binary as the `postgres` user (it refuses root), on a
//! free loopback port, its clients checked by the server's own password;
//! removed by a watchdog once this process exits.
//!
//! Its settings are PgBouncer's defaults but for the pool mode and what a
//! test asks for ([`Bouncer::start`]); in particular no
//! `ignore_startup_parameters`, so a client that sends a startup parameter
//! PgBouncer does not know is refused, as in a default deployment.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use crate::process;

/// What `ALKSTORE_REQUIRE` names to make these tests fail rather than skip.
pub const REQUIRE_NAME: &str = "pgbouncer";

/// PgBouncer's pool modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `pool_mode = session`.
    Session,
    /// `pool_mode = transaction`.
    Transaction,
}

impl Mode {
    fn setting(self) -> &'static str {
        match self {
            Mode::Session => "session",
            Mode::Transaction => "transaction",
        }
    }
}

/// A running PgBouncer.
#[derive(Debug)]
pub struct Bouncer {
    /// The superuser's URL through it (the server's database `postgres`);
    /// any database name is passed through to the server.
    pub url: String,
    /// The port it listens on.
    pub port: u16,
    /// Its pool mode.
    pub mode: Mode,
    /// The server it forwards to: host and port.
    pub server: (String, u16),
    /// Its directory (configuration, log, pid file).
    pub dir: PathBuf,
}

impl Bouncer {
    /// This bouncer's URL for database `database`, with `params` (such as
    /// `pooler=transaction`) added.
    pub fn url_for(&self, database: &str, params: &str) -> String {
        let base = self
            .url
            .rsplit_once('/')
            .map_or(&*self.url, |(base, _)| base);
        match params {
            "" => format!("{base}/{database}"),
            params => format!("{base}/{database}?{params}"),
        }
    }

    /// Starts a PgBouncer in `mode` in front of the test server, with more
    /// `[pgbouncer]` settings (`name = value` lines) after the defaults;
    /// `None` (the reason printed, or a panic when PgBouncer is required)
    /// when there is no server or no `pgbouncer` binary.
    pub fn start(mode: Mode, settings: &[&str]) -> Option<Bouncer> {
        let server = crate::pg::server()?;
        Self::start_for(&server.url, mode, settings)
    }

    /// As [`Bouncer::start`], in front of the server `server_url` names
    /// (`postgres://user:password@host:port/db`: a cluster of a test's
    /// own, [`crate::pg::Own`]).
    pub fn start_for(server_url: &str, mode: Mode, settings: &[&str]) -> Option<Bouncer> {
        let Some(binary) = process::find_tool("pgbouncer") else {
            process::skip_or_fail(
                REQUIRE_NAME,
                "no pgbouncer binary found",
                "install the pgbouncer package",
            );
            return None;
        };
        match start(&binary, server_url, mode, settings) {
            Ok(bouncer) => Some(bouncer),
            Err(why) => {
                process::skip_or_fail(REQUIRE_NAME, &why, "see PgBouncer's log in the message");
                None
            }
        }
    }

    /// PgBouncer's own log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("log")).unwrap_or_default()
    }
}

static SHARED: [OnceLock<Option<Bouncer>>; 2] = [OnceLock::new(), OnceLock::new()];

/// The PgBouncer in `mode` that this process's tests share, with the
/// default settings but the pool's size (PgBouncer's default is 20 server
/// connections): in session mode 300, as each client connection keeps one
/// and the tests run many stores at once; in transaction mode 50, as the
/// contract's races run 32 contenders on 16 stores at once, and a loaded
/// machine made 20 a queue that slowed them below the grants a race needs.
/// `None` as for [`Bouncer::start`].
pub fn shared(mode: Mode) -> Option<&'static Bouncer> {
    let settings: &[&str] = match mode {
        Mode::Session => &["default_pool_size = 300"],
        Mode::Transaction => &["default_pool_size = 50"],
    };
    SHARED[mode as usize]
        .get_or_init(|| Bouncer::start(mode, settings))
        .as_ref()
}

/// `postgres://user:password@host:port/database` taken apart.
fn parts(url: &str) -> Result<(String, String, String, u16), String> {
    let bad = || "the test server's URL is not postgres://user:password@host:port/db".to_owned();
    let rest = url.split_once("://").ok_or_else(bad)?.1;
    let (credentials, rest) = rest.rsplit_once('@').ok_or_else(bad)?;
    let (user, password) = credentials.split_once(':').ok_or_else(bad)?;
    let address = rest.split(['/', '?']).next().ok_or_else(bad)?;
    let (host, port) = address.rsplit_once(':').unwrap_or((address, "5432"));
    let port = port.parse().map_err(|_| bad())?;
    Ok((user.into(), password.into(), host.into(), port))
}

fn start(
    binary: &Path,
    server_url: &str,
    mode: Mode,
    settings: &[&str],
) -> Result<Bouncer, String> {
    let (user, password, host, server_port) = parts(server_url)?;
    let as_postgres = process::is_root();
    let dir = process::kept_temp_dir("alkstore-pgbouncer-")?;
    let port = process::free_port()?;
    // Clients log in with the server's password (SCRAM, checked by
    // PgBouncer from its auth file); PgBouncer logs in to the server with
    // the same.
    std::fs::write(
        dir.join("users.txt"),
        format!("\"{user}\" \"{password}\"\n"),
    )
    .map_err(|e| format!("cannot write the auth file: {e}"))?;
    let mut ini = format!(
        "[databases]\n\
         * = host={host} port={server_port} user={user} password={password}\n\
         [pgbouncer]\n\
         listen_addr = 127.0.0.1\n\
         listen_port = {port}\n\
         unix_socket_dir =\n\
         auth_type = scram-sha-256\n\
         auth_file = {dir}/users.txt\n\
         admin_users = {user}\n\
         logfile = {dir}/log\n\
         pidfile = {dir}/pid\n\
         pool_mode = {mode}\n\
         max_client_conn = 2000\n",
        dir = dir.display(),
        mode = mode.setting(),
    );
    for setting in settings {
        ini += setting;
        ini.push('\n');
    }
    let config = dir.join("pgbouncer.ini");
    std::fs::write(&config, ini).map_err(|e| format!("cannot write pgbouncer.ini: {e}"))?;
    if as_postgres {
        process::run(
            Path::new("chown"),
            &["-R", "postgres:", dir.to_str().ok_or("temp dir not UTF-8")?],
            None,
        )?;
    }
    let user_of = as_postgres.then_some("postgres");
    let pidfile = dir.join("pid");
    let stop = format!(
        "kill -INT $(cat '{}' 2>/dev/null) 2>/dev/null",
        pidfile.display()
    );
    process::spawn_watchdog(&stop, &dir)?;
    let config_arg = config.to_str().ok_or("temp dir not UTF-8")?;
    process::run(binary, &["-d", "-q", config_arg], user_of).map_err(|e| {
        let log = std::fs::read_to_string(dir.join("log")).unwrap_or_default();
        format!("{e}; log: {log}").replace(&password, "****")
    })?;
    process::until(Duration::from_secs(10), "PgBouncer to listen", || {
        Ok(std::net::TcpStream::connect(("127.0.0.1", port)).is_ok())
    })?;
    Ok(Bouncer {
        url: format!("postgres://{user}:{password}@127.0.0.1:{port}/postgres"),
        port,
        mode,
        server: (host, server_port),
        dir,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_urls_come_apart() {
        assert_eq!(
            parts("postgres://postgres:pw@127.0.0.1:5433/postgres").unwrap(),
            ("postgres".into(), "pw".into(), "127.0.0.1".into(), 5433)
        );
        assert_eq!(
            parts("postgres://u:p@db/app?sslmode=disable").unwrap(),
            ("u".into(), "p".into(), "db".into(), 5432)
        );
        assert!(parts("postgres://db/app").is_err());
    }
}
