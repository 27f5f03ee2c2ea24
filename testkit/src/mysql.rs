//! Finding or starting the MariaDB (or MySQL) server the tests run against.
//!
//! `ALKSTORE_MYSQL_URL` when set; otherwise a throwaway MariaDB this process
//! starts from the installed `mariadb-install-db` and `mariadbd`, in a temp
//! dir, on a free loopback port (as the `mysql` user when run as root),
//! stopped and removed by a watchdog once this process exits. Its only TCP
//! account is a superuser with a random password only this process knows;
//! root logs in through the socket only, as its own OS user.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::certs::Certificates;
use crate::process;

/// The URL of a server to use instead of starting one.
pub const URL_VAR: &str = "ALKSTORE_MYSQL_URL";

/// A MariaDB or MySQL server for tests.
#[derive(Debug)]
pub struct Server {
    /// Connection URL (a superuser, with the instance's random password),
    /// naming no database.
    pub url: String,
    /// The instance this process started, if it started one.
    pub instance: Option<Instance>,
}

/// A throwaway MariaDB started by this process.
#[derive(Debug)]
pub struct Instance {
    /// The directory holding the data directory, the log, the socket and
    /// the pid file.
    pub dir: PathBuf,
    /// The `mariadbd` binary.
    pub mariadbd: PathBuf,
    /// The loopback port it listens on.
    pub port: u16,
    /// Whether it runs as the `mysql` user (this process is root).
    pub as_mysql_user: bool,
    /// More server options (`--name=value`), given at every start.
    pub settings: Vec<String>,
}

impl Instance {
    fn user(&self) -> Option<&'static str> {
        self.as_mysql_user.then_some("mysql")
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn pid_file(&self) -> PathBuf {
        self.dir.join("mariadbd.pid")
    }

    fn log(&self) -> PathBuf {
        self.dir.join("mariadbd.err")
    }

    /// Its own temporary directory: servers that share one (`/tmp`) remove
    /// each other's temporary tables while they start (seen: two
    /// `mariadb-install-db` at once, "Unknown table 'mysql.tmp_user_sys'").
    fn tmp(&self) -> PathBuf {
        self.dir.join("tmp")
    }

    /// Starts the server (again) and waits until it accepts connections.
    pub fn start(&self) -> Result<(), String> {
        self.start_with(None)
    }

    fn start_with(&self, init_file: Option<&Path>) -> Result<(), String> {
        let log_before = std::fs::metadata(self.log()).map(|m| m.len()).unwrap_or(0);
        let mut args = vec![
            "--no-defaults".to_owned(),
            format!("--datadir={}", self.data().display()),
            format!("--tmpdir={}", self.tmp().display()),
            format!("--socket={}", self.dir.join("sock").display()),
            format!("--pid-file={}", self.pid_file().display()),
            format!("--log-error={}", self.log().display()),
            format!("--port={}", self.port),
            "--bind-address=127.0.0.1".into(),
            "--max-connections=500".into(),
            "--innodb-buffer-pool-size=64M".into(),
            "--innodb-log-file-size=16M".into(),
            "--skip-name-resolve".into(),
        ];
        args.extend(self.settings.iter().cloned());
        if let Some(init_file) = init_file {
            args.push(format!("--init-file={}", init_file.display()));
        }
        // A session of its own: the test's signals are not the server's.
        let mut command = process::command_as(self.user(), Path::new("setsid"));
        command
            .arg(&self.mariadbd)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        command
            .spawn()
            .map_err(|e| format!("could not start mariadbd: {e}"))?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let log = std::fs::read(self.log()).unwrap_or_default();
            let new = String::from_utf8_lossy(log.get(log_before as usize..).unwrap_or_default());
            if new.contains("ready for connections") {
                return Ok(());
            }
            if new.contains("[ERROR] Aborting") || Instant::now() > deadline {
                return Err(format!("mariadbd did not start: {new}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The server's process id, from its pid file.
    pub fn pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.pid_file())
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Stops the server with `signal` (`TERM`: a clean shutdown; `KILL`: a
    /// crash) and waits until it is gone.
    pub fn stop(&self, signal: &str) -> Result<(), String> {
        let pid = self.pid().ok_or("no pid file")?;
        process::run(
            Path::new("kill"),
            &[&format!("-{signal}"), &pid.to_string()],
            None,
        )?;
        let deadline = Instant::now() + Duration::from_secs(60);
        while Path::new(&format!("/proc/{pid}")).exists() {
            if Instant::now() > deadline {
                return Err(format!("mariadbd {pid} did not stop"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = std::fs::remove_file(self.pid_file());
        Ok(())
    }
}

static SERVER: OnceLock<Result<Server, String>> = OnceLock::new();

/// The server for this process's tests, or `None` (after printing why) when
/// there is none and MySQL is not [required](crate::required).
///
/// # Panics
/// When no server can be had and `mysql` is required.
pub fn server() -> Option<&'static Server> {
    process::found_or_skipped(
        SERVER.get_or_init(find_or_start),
        "mysql",
        &format!("set {URL_VAR}, or install MariaDB's server (mariadb-server)"),
    )
}

fn find_or_start() -> Result<Server, String> {
    if let Ok(url) = std::env::var(URL_VAR) {
        if !url.is_empty() {
            return Ok(Server {
                url,
                instance: None,
            });
        }
    }
    let (install_db, mariadbd) = binaries().ok_or("no mariadb-install-db or mariadbd found")?;
    let (instance, password) = start_instance(&install_db, mariadbd, Vec::new())?;
    Ok(Server {
        url: instance.url(&password),
        instance: Some(instance),
    })
}

/// `mariadb-install-db` and `mariadbd`, from the PATH or `/usr/sbin`, `/usr/bin`.
fn binaries() -> Option<(PathBuf, PathBuf)> {
    let find = process::find_tool;
    Some((find("mariadb-install-db")?, find("mariadbd")?))
}

fn start_instance(
    install_db: &Path,
    mariadbd: PathBuf,
    settings: Vec<String>,
) -> Result<(Instance, String), String> {
    start_instance_with(install_db, mariadbd, settings, false).map(|(i, p, _)| (i, p))
}

/// [`start_instance`], and with `tls_only` a server that accepts only TLS
/// over TCP, with its certificates.
fn start_instance_with(
    install_db: &Path,
    mariadbd: PathBuf,
    settings: Vec<String>,
    tls_only: bool,
) -> Result<(Instance, String, Option<Certificates>), String> {
    let as_mysql_user = process::is_root();
    let dir = process::kept_temp_dir("alkstore-mysql-")?;
    if as_mysql_user {
        process::hand_to("mysql", &dir)?;
    }
    let mut instance = Instance {
        dir,
        mariadbd,
        port: process::free_port()?,
        as_mysql_user,
        settings,
    };
    let data = format!("--datadir={}", instance.data().display());
    std::fs::create_dir(instance.tmp()).map_err(|e| format!("cannot make the tmpdir: {e}"))?;
    if as_mysql_user {
        process::hand_to("mysql", &instance.tmp())?;
    }
    let tmp = format!("--tmpdir={}", instance.tmp().display());
    process::run(
        install_db,
        &[
            "--no-defaults",
            &data,
            &tmp,
            "--auth-root-authentication-method=socket",
            "--skip-test-db",
            "--innodb-log-file-size=16M",
        ],
        instance.user(),
    )?;
    spawn_watchdog(&instance)?;
    // The TCP superuser, made by the server itself at its first start; the
    // file is gone once the server is up.
    let password = process::random_password()?;
    let mut init_sql = format!(
        "CREATE USER 'alkstore'@'127.0.0.1' IDENTIFIED BY '{password}';\n\
         GRANT ALL PRIVILEGES ON *.* TO 'alkstore'@'127.0.0.1' WITH GRANT OPTION;\n"
    );
    let certs = match tls_only {
        true => Some(instance.require_tls(&mut init_sql)?),
        false => None,
    };
    let init = instance.dir.join("init.sql");
    std::fs::write(&init, init_sql).map_err(|e| format!("cannot write the init file: {e}"))?;
    if as_mysql_user {
        process::hand_to("mysql", &init)?;
    }
    let started = instance.start_with(Some(&init));
    let _ = std::fs::remove_file(&init);
    started?;
    Ok((instance, password, certs))
}

impl Instance {
    /// Makes certificates in its directory and settings that accept only
    /// TLS over TCP; adds to `init_sql` the user `alk`, a superuser who
    /// logs in with a client certificate of common name `alk` signed by
    /// the CA, and no password.
    fn require_tls(&mut self, init_sql: &mut String) -> Result<Certificates, String> {
        let dir = self.dir.join("certs");
        std::fs::create_dir(&dir).map_err(|e| format!("cannot make {dir:?}: {e}"))?;
        let certs = Certificates::make(&dir)?;
        if self.as_mysql_user {
            for entry in std::fs::read_dir(&dir).map_err(|e| e.to_string())? {
                process::hand_to("mysql", &entry.map_err(|e| e.to_string())?.path())?;
            }
            process::hand_to("mysql", &dir)?;
        }
        self.settings.extend([
            format!("--ssl-ca={}", certs.ca.display()),
            format!("--ssl-cert={}", certs.server_cert.display()),
            format!("--ssl-key={}", certs.server_key.display()),
            "--require-secure-transport=ON".to_owned(),
        ]);
        init_sql.push_str(
            "CREATE USER 'alk'@'127.0.0.1' REQUIRE SUBJECT '/CN=alk';\n\
             GRANT ALL PRIVILEGES ON *.* TO 'alk'@'127.0.0.1';\n",
        );
        Ok(certs)
    }

    /// The superuser's URL over TCP.
    fn url(&self, password: &str) -> String {
        format!("mysql://alkstore:{password}@127.0.0.1:{}", self.port)
    }

    /// The first value `sql` answers, run by the `mariadb` client as the
    /// superuser over TCP (the password through the environment, the
    /// statements — which may hold other passwords — on its standard input:
    /// neither on a command line other local users can read).
    fn query(&self, password: &str, sql: &str) -> Result<String, String> {
        use std::io::Write;
        let mut client = std::process::Command::new("mariadb")
            .args([
                "--no-defaults",
                "-N",
                "-B",
                "-h",
                "127.0.0.1",
                "-u",
                "alkstore",
            ])
            .arg(format!("--port={}", self.port))
            .env("MYSQL_PWD", password)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("could not run the mariadb client: {e}"))?;
        // Dropped after the write: the client reads to the end, then runs.
        client
            .stdin
            .take()
            .ok_or("the mariadb client has no standard input")?
            .write_all(format!("{};\n", sql.trim_end().trim_end_matches(';')).as_bytes())
            .map_err(|e| format!("could not send the mariadb client {sql:?}: {e}"))?;
        let output = client
            .wait_with_output()
            .map_err(|e| format!("could not run the mariadb client: {e}"))?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
        } else {
            Err(format!(
                "{sql:?} failed: {}",
                String::from_utf8_lossy(&output.stderr)
            ))
        }
    }

    /// Runs `sql` with the `mariadb` client as the superuser over TCP (the
    /// password through the environment, never on a command line).
    fn sql(&self, password: &str, sql: &str) -> Result<(), String> {
        self.query(password, sql).map(drop)
    }
}

/// The binaries to start servers of a test's own (`mariadb-install-db`,
/// `mariadbd`); `None`, the reason printed, when a server is given by URL
/// (`why`: what the test needs of its own) or there are none.
fn own_binaries(why: &str) -> Option<(PathBuf, PathBuf)> {
    if std::env::var(URL_VAR).is_ok_and(|url| !url.is_empty()) {
        eprintln!("SKIPPED: {why} of its own, not {URL_VAR}");
        return None;
    }
    let found = binaries();
    if found.is_none() {
        process::skip_or_fail(
            "mysql",
            "no mariadb-install-db or mariadbd found",
            "install MariaDB's server (mariadb-server)",
        );
    }
    found
}

/// A throwaway server of the caller's own, started with more server
/// options (`--name=value`): a test of one configuration. Removed by its
/// watchdog when this process ends. `None` (the reason printed) as for
/// [`Pair::start`].
pub fn own_server(settings: &[&str]) -> Option<Server> {
    let (install_db, mariadbd) = own_binaries("a test of one configuration needs a server")?;
    let settings = settings.iter().map(|s| (*s).to_owned()).collect();
    let (instance, password) =
        start_instance(&install_db, mariadbd, settings).expect("start a server of its own");
    Some(Server {
        url: instance.url(&password),
        instance: Some(instance),
    })
}

/// A throwaway server of a test's own that accepts only TLS over TCP
/// (`require_secure_transport`), with throwaway certificates
/// ([`Certificates`]): the server's for `127.0.0.1`, signed by
/// [`Certificates::ca`]. Removed by its watchdog when this process ends.
#[derive(Debug)]
pub struct TlsServer {
    /// The server.
    pub instance: Instance,
    /// The superuser's URL (a password), with no TLS parameter.
    pub url: String,
    /// The URL of the user `alk`, who has no password and logs in with
    /// the client certificate (`ssl-cert`, `ssl-key`), with no TLS
    /// parameter.
    pub cert_url: String,
    /// The certificates.
    pub certs: Certificates,
}

impl TlsServer {
    /// Starts one; `None` (the reason printed) as for [`Pair::start`].
    pub fn start() -> Option<TlsServer> {
        let (install_db, mariadbd) = own_binaries("a TLS test needs a server")?;
        let (instance, password, certs) =
            start_instance_with(&install_db, mariadbd, Vec::new(), true)
                .expect("start a TLS-only server");
        Some(TlsServer {
            url: instance.url(&password),
            cert_url: format!("mysql://alk@127.0.0.1:{}", instance.port),
            instance,
            certs: certs.expect("a TLS-only server has certificates"),
        })
    }
}

/// A primary with one replica (GTID replication, binary logs on both),
/// throwaway servers of their own for failover tests, removed by their
/// watchdogs when this process ends.
#[derive(Debug)]
pub struct Pair {
    /// The primary (`server_id` 1).
    pub primary: Instance,
    /// The replica (`server_id` 2), replicating until [`Pair::cut`].
    pub replica: Instance,
    /// The primary's superuser URL.
    pub primary_url: String,
    /// The replica's superuser URL.
    pub replica_url: String,
    /// The primary's URL for a superuser the replica knows too (made on
    /// the primary and replicated), with the same password on both: an
    /// address moved from one to the other (a failover manager's) takes
    /// its connections.
    pub shared_url: String,
    replica_password: String,
}

impl Pair {
    /// Starts a primary and a replica replicating from it, from the
    /// primary's next transaction on. With `semi_sync`, lossless
    /// semi-synchronous replication: the primary's commits wait for the
    /// replica's acknowledgement after the binary log is synced and before
    /// the engine commits (`AFTER_SYNC`, `sync_binlog = 1`), with the
    /// longest timeout (no fallback to asynchronous). `None` (the reason
    /// printed) when there are no server binaries, or when a server is
    /// given by URL.
    pub fn start(semi_sync: bool) -> Option<Pair> {
        let (install_db, mariadbd) = own_binaries("a failover test needs servers")?;
        Some(
            Self::start_with(&install_db, mariadbd, semi_sync)
                .expect("start a primary and a replica"),
        )
    }

    fn start_with(install_db: &Path, mariadbd: PathBuf, semi_sync: bool) -> Result<Pair, String> {
        let logs = |id: u32| {
            vec![
                format!("--server-id={id}"),
                "--log-bin=binlog".to_owned(),
                "--binlog-format=ROW".to_owned(),
            ]
        };
        let mut primary_settings = logs(1);
        let mut replica_settings = logs(2);
        if semi_sync {
            primary_settings.push("--sync-binlog=1".to_owned());
            replica_settings.push("--rpl-semi-sync-slave-enabled=ON".to_owned());
        }
        let (primary, primary_password) =
            start_instance(install_db, mariadbd.clone(), primary_settings)?;
        let (replica, replica_password) = start_instance(install_db, mariadbd, replica_settings)?;
        // Each server made its own superuser: replicate what comes next only.
        primary.sql(&primary_password, "RESET MASTER")?;
        // Semi-sync from here on (enabled at the start, the first server's
        // own setup would wait for a replica that does not exist yet).
        if semi_sync {
            primary.sql(
                &primary_password,
                "SET GLOBAL rpl_semi_sync_master_wait_point = AFTER_SYNC,
                     rpl_semi_sync_master_timeout = 4294967295,
                     rpl_semi_sync_master_enabled = ON",
            )?;
        }
        replica.sql(
            &replica_password,
            &format!(
                "SET GLOBAL gtid_slave_pos = '';
                 CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = {},
                     MASTER_USER = 'alkstore', MASTER_PASSWORD = '{primary_password}',
                     MASTER_USE_GTID = slave_pos;
                 START SLAVE",
                primary.port
            ),
        )?;
        // A superuser both know, replicated.
        let shared_password = process::random_password()?;
        primary.sql(
            &primary_password,
            &format!(
                "CREATE USER 'shared'@'127.0.0.1' IDENTIFIED BY '{shared_password}';
                 GRANT ALL PRIVILEGES ON *.* TO 'shared'@'127.0.0.1'"
            ),
        )?;
        // Ready once the replica receives (with `semi_sync`: acknowledges).
        if semi_sync {
            process::until(
                Duration::from_secs(30),
                "the replica to acknowledge",
                || {
                    let clients = primary.query(
                        &primary_password,
                        "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS
                     WHERE VARIABLE_NAME = 'RPL_SEMI_SYNC_MASTER_CLIENTS'",
                    )?;
                    Ok(clients == "1")
                },
            )?;
        }
        Ok(Pair {
            shared_url: format!(
                "mysql://shared:{shared_password}@127.0.0.1:{}",
                primary.port
            ),
            primary_url: primary.url(&primary_password),
            replica_url: replica.url(&replica_password),
            primary,
            replica,
            replica_password,
        })
    }

    /// Stops shipping the binary log to the replica, as a network split
    /// would (`STOP SLAVE IO_THREAD`: what it received is still applied).
    pub fn cut(&self) -> Result<(), String> {
        self.replica
            .sql(&self.replica_password, "STOP SLAVE IO_THREAD")
    }

    /// Kills the primary (`SIGKILL`, as a crash).
    pub fn kill_primary(&self) -> Result<(), String> {
        self.primary.stop("KILL")
    }

    /// Promotes the replica as a failover manager would: replication
    /// stopped and forgotten (`STOP SLAVE; RESET SLAVE ALL`).
    pub fn promote(&self) -> Result<(), String> {
        self.replica
            .sql(&self.replica_password, "STOP SLAVE; RESET SLAVE ALL")
    }
}

/// Kills the server and removes its directory once this process is gone.
fn spawn_watchdog(instance: &Instance) -> Result<(), String> {
    let stop = format!(
        "kill -KILL $(cat '{}' 2>/dev/null) 2>/dev/null; sleep 1",
        instance.pid_file().display()
    );
    process::spawn_watchdog(&stop, &instance.dir)
}
