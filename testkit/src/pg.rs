//! Finding or starting the PostgreSQL server the tests run against.

use crate::certs::Certificates;
use crate::process;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

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
    /// More server settings, `name=value`, given at every start.
    pub settings: Vec<String>,
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

    /// The first value `sql` answers, run by `psql` as the superuser over
    /// the cluster's own socket.
    pub fn query(&self, sql: &str) -> Result<String, String> {
        let port = self.port.to_string();
        let dir = self.dir.display().to_string();
        let args = [
            "-h", &dir, "-p", &port, "-U", "postgres", "-d", "postgres", "-Atc", sql,
        ];
        process::output(Path::new("psql"), &args, self.user()).map(|out| out.trim().to_owned())
    }

    /// Runs `pg_ctl` with `args` against this cluster (for fault tests:
    /// `stop -m fast`, `start`); true when it succeeded.
    pub fn pg_ctl(&self, args: &[&str]) -> bool {
        let mut full: Vec<String> = vec!["-D".into(), self.data().display().to_string()];
        full.extend(args.iter().map(|a| a.to_string()));
        if args.contains(&"start") || args.contains(&"restart") {
            let mut options = format!(
                "-c listen_addresses=127.0.0.1 -p {} -k {} -c max_connections=400 \
                 -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all",
                self.port,
                self.dir.display()
            );
            for setting in &self.settings {
                options += &format!(" -c {setting}");
            }
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
    process::found_or_skipped(
        SERVER.get_or_init(find_or_start),
        "postgres",
        &format!("set {URL_VAR}, or install PostgreSQL's server binaries"),
    )
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

/// The directory of the installed server binaries, as [`resolved`]: what
/// a tool that runs them all (Patroni) is given.
pub fn server_bin_dir() -> Option<PathBuf> {
    find_bin_dir().map(resolved)
}

/// `bin` through links: `initdb` on the PATH may be a link into the
/// server's own bin directory, which alone holds `pg_basebackup`.
fn resolved(bin: PathBuf) -> PathBuf {
    std::fs::canonicalize(bin.join("initdb"))
        .ok()
        .and_then(|initdb| initdb.parent().map(Path::to_path_buf))
        .unwrap_or(bin)
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
    let (cluster, password) = new_cluster(bin, Vec::new())?;
    Ok(Server {
        url: cluster.url(&password),
        cluster: Some(cluster),
    })
}

/// A new temp dir for a cluster, owned by the cluster's user.
fn cluster_dir() -> Result<(PathBuf, bool), String> {
    let as_postgres_user = process::is_root();
    let dir = process::kept_temp_dir("alkstore-pg-")?;
    if as_postgres_user {
        process::hand_to("postgres", &dir)?;
    }
    Ok((dir, as_postgres_user))
}

impl Cluster {
    /// The superuser's URL over TCP.
    fn url(&self, password: &str) -> String {
        format!(
            "postgres://postgres:{password}@127.0.0.1:{}/postgres",
            self.port
        )
    }

    /// Starts it; the error holds its log.
    fn start(&self) -> Result<(), String> {
        if self.pg_ctl(&["start"]) {
            Ok(())
        } else {
            let log = std::fs::read_to_string(self.dir.join("log")).unwrap_or_default();
            Err(format!("pg_ctl start failed: {log}"))
        }
    }
}

/// A new cluster, started, with `settings`; and its superuser's password.
fn new_cluster(bin: PathBuf, settings: Vec<String>) -> Result<(Cluster, String), String> {
    let (cluster, password) = init_cluster(bin, settings)?;
    cluster.start()?;
    Ok((cluster, password))
}

/// A new cluster, made but not started, with `settings`; and its
/// superuser's password.
fn init_cluster(bin: PathBuf, settings: Vec<String>) -> Result<(Cluster, String), String> {
    let (dir, as_postgres_user) = cluster_dir()?;
    let cluster = Cluster {
        dir,
        bin,
        port: process::free_port()?,
        as_postgres_user,
        settings,
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
    Ok((cluster, password))
}

/// The server binaries, for a test that starts clusters of its own
/// (`why`); `None` (the reason printed, or a panic when PostgreSQL is
/// required) when there are none, or when a server is given by URL.
fn bin_dir_of_its_own(why: &str) -> Option<PathBuf> {
    if std::env::var(URL_VAR).is_ok_and(|url| !url.is_empty()) {
        eprintln!("SKIPPED: {why}, not {URL_VAR}");
        return None;
    }
    let bin = find_bin_dir();
    if bin.is_none() {
        process::skip_or_fail(
            "postgres",
            "no PostgreSQL server binaries (initdb, pg_ctl) found",
            "install PostgreSQL's server binaries",
        );
    }
    bin
}

/// A throwaway cluster of a test's own, to stop and start (the shared
/// [`server`] must stay up for the other tests), removed by its watchdog
/// when this process ends.
#[derive(Debug)]
pub struct Own {
    /// The cluster.
    pub cluster: Cluster,
    /// Its superuser's URL.
    pub url: String,
}

impl Own {
    /// Starts one; `None` (the reason printed, or a panic when PostgreSQL
    /// is required) when there are no server binaries, or when a server is
    /// given by URL.
    pub fn start() -> Option<Own> {
        let bin = bin_dir_of_its_own("this test needs a cluster of its own")?;
        let (cluster, password) =
            new_cluster(resolved(bin), Vec::new()).expect("start a cluster of the test's own");
        let url = cluster.url(&password);
        Some(Own { cluster, url })
    }
}

/// A throwaway cluster of a test's own that accepts only TLS connections
/// over TCP, with throwaway certificates ([`Certificates`]): the server's
/// for `127.0.0.1`, signed by [`Certificates::ca`].
///
/// Its `pg_hba.conf`: the role `alk` logs in with its client certificate
/// alone (`cert`: signed by the CA, common name `alk`); every other role
/// with its password over TLS; any connection without TLS is refused.
#[derive(Debug)]
pub struct TlsOwn {
    /// The cluster.
    pub cluster: Cluster,
    /// Its superuser's URL, with no TLS parameter.
    pub url: String,
    /// The URL of the role `alk` (a superuser with no password), with no
    /// TLS parameter: it needs `sslcert` and `sslkey`.
    pub cert_url: String,
    /// The certificates.
    pub certs: Certificates,
}

/// The lines of a [`TlsOwn`]'s `pg_hba.conf`.
const TLS_ONLY_HBA: &str = "\
local all all trust
hostssl all alk 127.0.0.1/32 cert
hostssl all all 127.0.0.1/32 scram-sha-256
hostnossl all all all reject
";

impl TlsOwn {
    /// Starts one; `None` as for [`Own::start`].
    pub fn start() -> Option<TlsOwn> {
        let bin = bin_dir_of_its_own("this test needs a TLS-only cluster of its own")?;
        Some(Self::start_with(resolved(bin)).expect("start a TLS-only cluster"))
    }

    fn start_with(bin: PathBuf) -> Result<TlsOwn, String> {
        let (mut cluster, password) = init_cluster(bin, Vec::new())?;
        let certs_dir = cluster.dir.join("certs");
        std::fs::create_dir(&certs_dir).map_err(|e| format!("cannot make {certs_dir:?}: {e}"))?;
        let certs = Certificates::make(&certs_dir)?;
        // The server refuses a key others may read, and must read its own.
        for entry in std::fs::read_dir(&certs_dir).map_err(|e| e.to_string())? {
            let path = entry.map_err(|e| e.to_string())?.path();
            set_mode(&path, 0o600)?;
            if cluster.as_postgres_user {
                process::hand_to("postgres", &path)?;
            }
        }
        if cluster.as_postgres_user {
            process::hand_to("postgres", &certs_dir)?;
        }
        let file = |p: &Path| p.to_str().map(str::to_owned).ok_or("temp dir not UTF-8");
        cluster.settings = vec![
            "ssl=on".to_owned(),
            format!("ssl_cert_file={}", file(&certs.server_cert)?),
            format!("ssl_key_file={}", file(&certs.server_key)?),
            format!("ssl_ca_file={}", file(&certs.ca)?),
        ];
        let hba = cluster.data().join("pg_hba.conf");
        std::fs::write(&hba, TLS_ONLY_HBA).map_err(|e| format!("cannot write {hba:?}: {e}"))?;
        cluster.start()?;
        cluster.query("CREATE ROLE alk LOGIN SUPERUSER")?;
        Ok(TlsOwn {
            url: cluster.url(&password),
            cert_url: format!("postgres://alk@127.0.0.1:{}/postgres", cluster.port),
            cluster,
            certs,
        })
    }
}

/// Sets `path`'s permission bits.
fn set_mode(path: &Path, mode: u32) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("cannot set {path:?}'s mode: {e}"))
}

/// A primary with one streaming standby, both throwaway clusters of their
/// own (for failover tests: each test makes its own pair), removed by their
/// watchdogs when this process ends.
#[derive(Debug)]
pub struct Pair {
    /// The primary.
    pub primary: Cluster,
    /// The standby, streaming from the primary until [`Pair::cut`].
    pub standby: Cluster,
    /// The primary's superuser URL.
    pub primary_url: String,
    /// The standby's superuser URL (same user and password).
    pub standby_url: String,
}

impl Pair {
    /// Starts a primary and a standby made from it with `pg_basebackup -R`.
    /// With `synchronous`, the primary's commits wait for the standby
    /// (`synchronous_standby_names = '*'`, `synchronous_commit = on`).
    /// `None` (the reason printed) when there are no server binaries, or
    /// when a server is given by URL (a pair needs clusters of its own).
    pub fn start(synchronous: bool) -> Option<Pair> {
        let bin = bin_dir_of_its_own("a failover test needs clusters of its own")?;
        Some(Self::start_with(bin, synchronous).expect("start a primary and a standby"))
    }

    fn start_with(bin: PathBuf, synchronous: bool) -> Result<Pair, String> {
        let bin = resolved(bin);
        let mut settings = vec![
            "wal_level=replica".to_owned(),
            "max_wal_senders=4".to_owned(),
        ];
        if synchronous {
            settings.push("synchronous_standby_names='*'".to_owned());
        }
        let (primary, password) = new_cluster(bin.clone(), settings)?;
        let (dir, as_postgres_user) = cluster_dir()?;
        let standby = Cluster {
            dir,
            bin,
            port: process::free_port()?,
            as_postgres_user,
            settings: Vec::new(),
        };
        let source = format!(
            "host=127.0.0.1 port={} user=postgres password={password} application_name=standby",
            primary.port
        );
        process::run(
            &standby.bin.join("pg_basebackup"),
            &[
                "-d",
                &source,
                "-D",
                standby
                    .data()
                    .to_str()
                    .ok_or("the temp dir's path is not UTF-8")?,
                "-R",
                "-X",
                "stream",
                "--no-sync",
            ],
            standby.user(),
        )
        .map_err(|e| e.replace(&password, "****"))?;
        spawn_watchdog(&standby)?;
        standby.start()?;
        // Ready once the primary sees the standby streaming (and, with
        // `synchronous`, as its synchronous standby).
        let ready = match synchronous {
            true => "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'",
            false => "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'",
        };
        process::until(Duration::from_secs(30), "the standby to stream", || {
            Ok(primary.query(ready)? == "1")
        })?;
        Ok(Pair {
            primary_url: primary.url(&password),
            standby_url: standby.url(&password),
            primary,
            standby,
        })
    }

    /// Stops WAL shipping to the standby, as a network split would: its
    /// `primary_conninfo` emptied and the configuration reloaded, so its
    /// WAL receiver stops and does not come back. (The test waits until
    /// `pg_stat_wal_receiver` on the standby is empty.)
    pub fn cut(&self) -> Result<(), String> {
        let auto = self.standby.data().join("postgresql.auto.conf");
        let kept: String = std::fs::read_to_string(&auto)
            .map_err(|e| format!("cannot read {}: {e}", auto.display()))?
            .lines()
            .filter(|line| !line.trim_start().starts_with("primary_conninfo"))
            .map(|line| format!("{line}\n"))
            .collect();
        std::fs::write(&auto, kept).map_err(|e| format!("cannot write {}: {e}", auto.display()))?;
        if self.standby.pg_ctl(&["reload"]) {
            Ok(())
        } else {
            Err("pg_ctl reload of the standby failed".into())
        }
    }

    /// Kills the primary (`pg_ctl stop -m immediate`: no shutdown
    /// checkpoint, as a crash).
    pub fn kill_primary(&self) -> Result<(), String> {
        if self.primary.pg_ctl(&["stop", "-m", "immediate"]) {
            Ok(())
        } else {
            Err("pg_ctl stop -m immediate of the primary failed".into())
        }
    }

    /// Promotes the standby (`pg_ctl promote`, waiting until it is done).
    pub fn promote(&self) -> Result<(), String> {
        if self.standby.pg_ctl(&["promote", "-w"]) {
            Ok(())
        } else {
            Err("pg_ctl promote of the standby failed".into())
        }
    }
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
