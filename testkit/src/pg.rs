//! Finding or starting the PostgreSQL server the tests run against.

use crate::process;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The URL of a server to use instead of starting one.
pub const URL_VAR: &str = "ALKSTORE_PG_URL";

/// A PostgreSQL server for tests.
#[derive(Debug)]
pub struct Server {
    /// Connection URL (a superuser on a throwaway cluster, with the
    /// cluster's random password).
    pub url: String,
    /// The cluster this process started, if it started one.
    pub cluster: Option<Cluster>,
}

/// A throwaway cluster started by this process.
#[derive(Debug)]
pub struct Cluster {
    /// The directory holding the data directory, the log and the socket.
    pub dir: PathBuf,
    /// The directory of `pg_ctl`, `initdb` and `postgres`.
    pub bin: PathBuf,
    /// The loopback port it listens on.
    pub port: u16,
    /// Whether commands must run as the `postgres` user (this process is root).
    pub as_postgres_user: bool,
}

impl Cluster {
    /// The user its commands run as, if not this process's.
    fn user(&self) -> Option<&'static str> {
        self.as_postgres_user.then_some("postgres")
    }

    /// The data directory.
    pub fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// Runs `pg_ctl` with `args` against this cluster (for fault tests:
    /// `stop -m fast`, `start`); true when it succeeded.
    pub fn pg_ctl(&self, args: &[&str]) -> bool {
        let mut full: Vec<String> = vec!["-D".into(), self.data().display().to_string()];
        full.extend(args.iter().map(|a| a.to_string()));
        if args.contains(&"start") || args.contains(&"restart") {
            let options = format!(
                "-c listen_addresses=127.0.0.1 -p {} -k {} -c max_connections=400 \
                 -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all",
                self.port,
                self.dir.display()
            );
            let log = self.dir.join("log").display().to_string();
            full.extend(["-w".into(), "-l".into(), log, "-o".into(), options]);
        }
        let full: Vec<&str> = full.iter().map(String::as_str).collect();
        process::run(&self.bin.join("pg_ctl"), &full, self.user()).is_ok()
    }
}

static SERVER: OnceLock<Result<Server, String>> = OnceLock::new();

/// The server for this process's tests, or `None` (after printing why) when
/// there is none and PostgreSQL is not [required](crate::required).
///
/// # Panics
/// When no server can be had and PostgreSQL is required.
pub fn server() -> Option<&'static Server> {
    match SERVER.get_or_init(find_or_start) {
        Ok(server) => Some(server),
        Err(why) => {
            process::skip_or_fail(
                "postgres",
                why,
                &format!("set {URL_VAR}, or install PostgreSQL's server binaries"),
            );
            None
        }
    }
}

/// A schema name no other test of any process uses.
pub fn unique_schema(prefix: &str) -> String {
    crate::unique_name(prefix)
}

fn find_or_start() -> Result<Server, String> {
    if let Ok(url) = std::env::var(URL_VAR) {
        if !url.is_empty() {
            return Ok(Server { url, cluster: None });
        }
    }
    let bin = find_bin_dir().ok_or("no PostgreSQL server binaries (initdb, pg_ctl) found")?;
    start_cluster(bin)
}

/// `initdb` on the PATH, or the newest `/usr/lib/postgresql/*/bin`.
fn find_bin_dir() -> Option<PathBuf> {
    let has_tools = |dir: &Path| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file();
    if let Some(path) = std::env::var_os("PATH") {
        if let Some(dir) = std::env::split_paths(&path).find(|d| has_tools(d)) {
            return Some(dir);
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| {
            let e = e.ok()?;
            let version = e.file_name().to_str()?.parse().ok()?;
            Some((version, e.path().join("bin")))
        })
        .filter(|(_, bin)| has_tools(bin))
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

fn start_cluster(bin: PathBuf) -> Result<Server, String> {
    let as_postgres_user = process::is_root();
    let dir = tempfile::Builder::new()
        .prefix("alkstore-pg-")
        .tempdir()
        .map_err(|e| format!("no temp dir: {e}"))?
        .keep();
    if as_postgres_user {
        process::hand_to("postgres", &dir)?;
    }
    let cluster = Cluster {
        dir,
        bin,
        port: process::free_port()?,
        as_postgres_user,
    };
    let data = cluster.data();
    // TCP logins need the superuser's password, which only this process
    // knows: other local users cannot take over the cluster for the run.
    // The Unix socket stays password-less, in a directory only the cluster's
    // user (and root) can enter.
    let password = process::random_password()?;
    let pwfile = cluster.dir.join("pwfile");
    std::fs::write(&pwfile, &password).map_err(|e| format!("cannot write the pwfile: {e}"))?;
    if as_postgres_user {
        process::hand_to("postgres", &pwfile)?;
    }
    let pwfile_arg = format!("--pwfile={}", pwfile.display());
    process::run(
        &cluster.bin.join("initdb"),
        &[
            "-D",
            data.to_str().unwrap(),
            "-U",
            "postgres",
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            &pwfile_arg,
            "--no-sync",
            "--encoding=UTF8",
            "--locale=C",
        ],
        cluster.user(),
    )?;
    let _ = std::fs::remove_file(&pwfile);
    spawn_watchdog(&cluster)?;
    if !cluster.pg_ctl(&["start"]) {
        let log = std::fs::read_to_string(cluster.dir.join("log")).unwrap_or_default();
        return Err(format!("pg_ctl start failed: {log}"));
    }
    Ok(Server {
        url: format!(
            "postgres://postgres:{password}@127.0.0.1:{}/postgres",
            cluster.port
        ),
        cluster: Some(cluster),
    })
}

/// Stops the cluster and removes its directory once this process is gone.
fn spawn_watchdog(cluster: &Cluster) -> Result<(), String> {
    let pg_ctl = cluster.bin.join("pg_ctl");
    let stop = format!(
        "{}{} -D '{}' -m immediate stop",
        if cluster.as_postgres_user {
            "runuser -u postgres -- "
        } else {
            ""
        },
        pg_ctl.display(),
        cluster.data().display()
    );
    process::spawn_watchdog(&stop, &cluster.dir)
}
