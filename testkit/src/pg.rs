//! Finding or starting the PostgreSQL server the tests run against.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

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
        run(&self.bin.join("pg_ctl"), &full, self.as_postgres_user).is_ok()
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
            if crate::required("postgres") {
                panic!(
                    "PostgreSQL is required ({}=postgres or {}=1) but unavailable: {why}",
                    crate::REQUIRE_VAR,
                    crate::REQUIRE_PG_VAR
                );
            }
            // Once per process, and past the test harness's output capture
            // (through /dev/stderr), so that a plain `cargo test` shows it.
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                use std::io::Write;
                let line = format!(
                    "SKIPPED: PostgreSQL tests skipped: {why} \
                     (set {URL_VAR}, or install PostgreSQL's server binaries)"
                );
                let direct = std::fs::OpenOptions::new()
                    .append(true)
                    .open("/dev/stderr")
                    .and_then(|mut stderr| writeln!(stderr, "{line}"));
                if direct.is_err() {
                    eprintln!("{line}");
                }
            });
            None
        }
    }
}

/// A schema name no other test of any process uses.
pub fn unique_schema(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{prefix}_{}_{}_{nanos}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
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

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// Runs `program args`, as the `postgres` user when asked; the error holds its output.
fn run(program: &Path, args: &[&str], as_postgres_user: bool) -> Result<(), String> {
    let mut command = if as_postgres_user {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    };
    let output = command
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("could not run {}: {e}", program.display()))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{} {args:?} failed ({}): {}{}",
            program.display(),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

/// Gives `path` to the `postgres` user, which runs the cluster when we are root.
fn hand_to_postgres(path: &Path) -> Result<(), String> {
    let path = path.to_str().ok_or("the temp dir's path is not UTF-8")?;
    run(Path::new("chown"), &["postgres:", path], false)
}

/// 32 hex digits from the system's random source.
fn random_password() -> Result<String, String> {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| format!("no random source for the cluster's password: {e}"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn free_port() -> Result<u16, String> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("no free port: {e}"))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| e.to_string())
}

fn start_cluster(bin: PathBuf) -> Result<Server, String> {
    let as_postgres_user = is_root();
    let dir = tempfile::Builder::new()
        .prefix("alkstore-pg-")
        .tempdir()
        .map_err(|e| format!("no temp dir: {e}"))?
        .keep();
    if as_postgres_user {
        hand_to_postgres(&dir)?;
    }
    let cluster = Cluster {
        dir,
        bin,
        port: free_port()?,
        as_postgres_user,
    };
    let data = cluster.data();
    // TCP logins need the superuser's password, which only this process
    // knows: other local users cannot take over the cluster for the run.
    // The Unix socket stays password-less, in a directory only the cluster's
    // user (and root) can enter.
    let password = random_password()?;
    let pwfile = cluster.dir.join("pwfile");
    std::fs::write(&pwfile, &password).map_err(|e| format!("cannot write the pwfile: {e}"))?;
    if as_postgres_user {
        hand_to_postgres(&pwfile)?;
    }
    let pwfile_arg = format!("--pwfile={}", pwfile.display());
    run(
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
        as_postgres_user,
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

/// Stops the cluster and removes its directory once this process is gone,
/// however it ends; its output goes nowhere, so it holds no test pipe open.
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
    let script = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 1; done; {stop}; rm -rf '{dir}'",
        pid = std::process::id(),
        dir = cluster.dir.display()
    );
    // A session of its own (setsid): a signal to the test's process group,
    // such as a timeout or Ctrl-C, must not take the watchdog down with it.
    Command::new("setsid")
        .args(["sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map(drop)
        .map_err(|e| format!("could not start the cluster watchdog: {e}"))
}
