//! Finding or starting the etcd cluster the etcd engine's tests run against:
//! the one at `ALKSTORE_ETCD_URL`, or three members this process starts from
//! the installed `etcd` (Debian's `etcd-server`) on free loopback ports, in
//! a temp dir that a watchdog removes, with every member, once this process
//! exits.
//!
//! The members beat every 50 ms and call an election after 500 ms without
//! a leader (etcd's defaults are 100 ms and 1 s): a leader change takes
//! about a second, and the shortest lease etcd grants is then 1 s, not 2 s
//! (etcd's floor is 1.5 election timeouts, rounded up to a second).

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use crate::certs::Certificates;
use crate::process;

/// The URL of a cluster to use instead of starting one
/// (`etcd://host:port[,host:port…]`).
pub const URL_VAR: &str = "ALKSTORE_ETCD_URL";

/// What `ALKSTORE_REQUIRE` names to make these tests fail rather than skip.
pub const REQUIRE_NAME: &str = "etcd";

/// Heartbeat and election timeout of the members this module starts, in ms.
const HEARTBEAT_MS: u32 = 50;
const ELECTION_MS: u32 = 500;

/// An etcd cluster for tests.
#[derive(Debug)]
pub struct Server {
    /// Its URL (`etcd://127.0.0.1:port,…`), without a prefix.
    pub url: String,
    /// The cluster this process started, if it started one.
    pub cluster: Option<Cluster>,
}

/// One member of a cluster this process started.
#[derive(Debug)]
pub struct Member {
    /// Its name (`e0`, `e1`, …).
    pub name: String,
    /// Its client endpoint, `127.0.0.1:port`.
    pub client: String,
    /// Its peer port.
    pub peer_port: u16,
    /// Its data directory.
    pub data: PathBuf,
}

/// A cluster of etcd members this process started.
#[derive(Debug)]
pub struct Cluster {
    /// Its directory: each member's data directory, log and pid file.
    pub dir: PathBuf,
    /// The members.
    pub members: Vec<Member>,
    /// The `--initial-cluster` every member was started with.
    initial: String,
    /// The shell command that stops every member.
    stop: String,
    /// Further flags every member is started with.
    flags: Vec<String>,
    /// `--user=root:…` for etcdctl, once authentication is on.
    root: std::sync::Mutex<Option<String>>,
    /// The certificates of a cluster serving TLS to its clients.
    pub tls: Option<Certificates>,
}

impl Cluster {
    /// Starts `count` members and waits until every one answers.
    pub fn start(count: usize) -> Result<Cluster, String> {
        Cluster::start_with(count, &[])
    }

    /// [`Cluster::start`], every member also given `flags` (such as
    /// `--auth-token-ttl=1`).
    pub fn start_with(count: usize, flags: &[&str]) -> Result<Cluster, String> {
        Cluster::start_as(count, flags, false)
    }

    /// [`Cluster::start`], the members serving their clients TLS only, and
    /// only to clients with a certificate of the same CA
    /// (`--client-cert-auth`); the certificates in [`Cluster::tls`].
    pub fn start_tls(count: usize) -> Result<Cluster, String> {
        Cluster::start_as(count, &[], true)
    }

    fn start_as(count: usize, flags: &[&str], tls: bool) -> Result<Cluster, String> {
        let etcd = process::find_tool("etcd").ok_or("no etcd binary found")?;
        let dir = process::kept_temp_dir("alkstore-etcd-")?;
        let tls = match tls {
            true => Some(Certificates::make(&dir)?),
            false => None,
        };
        let mut members = Vec::new();
        for i in 0..count {
            members.push(Member {
                name: format!("e{i}"),
                client: format!("127.0.0.1:{}", process::free_port()?),
                peer_port: process::free_port()?,
                data: dir.join(format!("e{i}")),
            });
        }
        let initial = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let stop = members
            .iter()
            .map(|m| {
                let pid = dir.join(format!("{}.pid", m.name));
                format!(
                    "kill -CONT $(cat '{p}' 2>/dev/null) 2>/dev/null; \
                     kill -KILL $(cat '{p}' 2>/dev/null) 2>/dev/null; rm -f '{p}'",
                    p = pid.display()
                )
            })
            .collect::<Vec<_>>()
            .join("; ");
        process::spawn_watchdog(&stop, &dir)?;
        let stop_on_error = process::StopOnError::new(stop.clone());
        let cluster = Cluster {
            dir,
            members,
            initial,
            stop,
            flags: flags.iter().map(|f| f.to_string()).collect(),
            root: std::sync::Mutex::new(None),
            tls,
        };
        for i in 0..count {
            cluster.spawn(i, &etcd)?;
        }
        for member in &cluster.members {
            process::until(Duration::from_secs(30), "etcd to listen", || {
                Ok(TcpStream::connect(&member.client).is_ok())
            })
            .map_err(|e| format!("{e}: {}", cluster.log_tail(member)))?;
        }
        process::until(Duration::from_secs(30), "etcd to elect a leader", || {
            Ok(cluster.leader().is_some())
        })?;
        stop_on_error.defuse();
        Ok(cluster)
    }

    /// The cluster's URL, every member's endpoint in it.
    pub fn url(&self) -> String {
        let endpoints: Vec<&str> = self.members.iter().map(|m| m.client.as_str()).collect();
        format!("etcd://{}", endpoints.join(","))
    }

    fn pid_file(&self, member: &Member) -> PathBuf {
        self.dir.join(format!("{}.pid", member.name))
    }

    /// The last ten lines of `member`'s log.
    pub fn log_tail(&self, member: &Member) -> String {
        let log = std::fs::read_to_string(self.dir.join(format!("{}.log", member.name)))
            .unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(10)..].join("\n")
    }

    /// Starts member `index` (again, after [`Cluster::kill`]: its data
    /// directory is kept, so it rejoins as itself).
    fn spawn(&self, index: usize, etcd: &std::path::Path) -> Result<(), String> {
        let m = &self.members[index];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{}.log", m.name)))
            .map_err(|e| e.to_string())?;
        let err = log.try_clone().map_err(|e| e.to_string())?;
        let peer = format!("http://127.0.0.1:{}", m.peer_port);
        let client = format!("{}://{}", self.scheme(), m.client);
        let mut tls = Vec::new();
        if let Some(certs) = &self.tls {
            for (flag, file) in [
                ("--cert-file", &certs.server_cert),
                ("--key-file", &certs.server_key),
                ("--trusted-ca-file", &certs.ca),
            ] {
                tls.push(flag.to_owned());
                tls.push(file.to_str().ok_or("temp dir not UTF-8")?.to_owned());
            }
            tls.push("--client-cert-auth".to_owned());
        }
        let child = Command::new(etcd)
            .args([
                "--name",
                &m.name,
                "--data-dir",
                m.data.to_str().ok_or("temp dir not UTF-8")?,
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
                "--initial-cluster",
                &self.initial,
                "--initial-cluster-token",
                &token(),
                "--heartbeat-interval",
                &HEARTBEAT_MS.to_string(),
                "--election-timeout",
                &ELECTION_MS.to_string(),
                "--logger",
                "zap",
                "--log-level",
                "warn",
            ])
            .args(&self.flags)
            .args(&tls)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("could not start etcd: {e}"))?;
        std::fs::write(self.pid_file(m), child.id().to_string()).map_err(|e| e.to_string())
    }

    fn scheme(&self) -> &'static str {
        match self.tls {
            Some(_) => "https",
            None => "http",
        }
    }

    fn signal(&self, index: usize, signal: &str) -> Result<(), String> {
        let pid = std::fs::read_to_string(self.pid_file(&self.members[index]))
            .map_err(|e| format!("{} is not running: {e}", self.members[index].name))?;
        process::run(std::path::Path::new("kill"), &[signal, pid.trim()], None)
    }

    /// Member `index` dies (SIGKILL): no shutdown, its data kept. Waits
    /// until its ports are closed: a signal is delivered after `kill`
    /// returns, and a member started again on ports the dying one still
    /// holds fails to listen (and exits).
    pub fn kill(&self, index: usize) -> Result<(), String> {
        self.signal(index, "-KILL")?;
        let member = &self.members[index];
        let _ = std::fs::remove_file(self.pid_file(member));
        let peer = ("127.0.0.1", member.peer_port);
        process::until(
            Duration::from_secs(30),
            "killed etcd to close its ports",
            || Ok(TcpStream::connect(&member.client).is_err() && TcpStream::connect(peer).is_err()),
        )
    }

    /// Starts member `index` again after [`Cluster::kill`], and waits until
    /// it listens.
    pub fn restart(&self, index: usize) -> Result<(), String> {
        self.spawn(
            index,
            &process::find_tool("etcd").ok_or("no etcd binary found")?,
        )?;
        let member = &self.members[index];
        process::until(Duration::from_secs(30), "etcd to listen again", || {
            Ok(TcpStream::connect(&member.client).is_ok())
        })
    }

    /// Member `index` stops running (SIGSTOP), its connections left open.
    pub fn pause(&self, index: usize) -> Result<(), String> {
        self.signal(index, "-STOP")
    }

    /// Member `index` runs again (SIGCONT) after [`Cluster::pause`].
    pub fn resume(&self, index: usize) -> Result<(), String> {
        self.signal(index, "-CONT")
    }

    /// Saves a snapshot of the cluster (`etcdctl snapshot save`, from the
    /// first member) to `path`.
    pub fn snapshot(&self, path: &std::path::Path) -> Result<(), String> {
        let path = path.to_str().ok_or("snapshot path not UTF-8")?;
        self.etcdctl_at(&self.members[0].client, &["snapshot", "save", path])
            .map(drop)
    }

    /// A disaster and its recovery: every member dies (SIGKILL), its data
    /// directory is removed, and the cluster is restored from `snapshot`
    /// (`etcdctl snapshot restore`, each member from the same file, as
    /// etcd's recovery guide says) and started on the same ports; waits
    /// until it has a leader. The cluster's revision is the snapshot's
    /// again: every write after the snapshot is gone.
    pub fn restore(&self, snapshot: &std::path::Path) -> Result<(), String> {
        let snapshot = snapshot.to_str().ok_or("snapshot path not UTF-8")?;
        for index in 0..self.members.len() {
            if self.pid_file(&self.members[index]).exists() {
                self.kill(index)?;
            }
        }
        for member in &self.members {
            std::fs::remove_dir_all(&member.data)
                .map_err(|e| format!("cannot remove {}: {e}", member.data.display()))?;
            let data = member.data.to_str().ok_or("temp dir not UTF-8")?;
            let peer = format!("http://127.0.0.1:{}", member.peer_port);
            etcdctl(
                &member.client,
                &[
                    "snapshot",
                    "restore",
                    snapshot,
                    "--name",
                    &member.name,
                    "--data-dir",
                    data,
                    "--initial-cluster",
                    &self.initial,
                    "--initial-cluster-token",
                    &token(),
                    "--initial-advertise-peer-urls",
                    &peer,
                ],
            )?;
        }
        for index in 0..self.members.len() {
            self.restart(index)?;
        }
        process::until(
            Duration::from_secs(30),
            "the restored etcd to elect",
            || Ok(self.leader().is_some()),
        )
    }

    /// `etcdctl` (Debian's `etcd-client`) on every member, with `args`.
    pub fn etcdctl(&self, args: &[&str]) -> Result<String, String> {
        let endpoints: Vec<&str> = self.members.iter().map(|m| m.client.as_str()).collect();
        self.etcdctl_at(&endpoints.join(","), args)
    }

    /// `etcdctl` on `endpoints`, as root once authentication is on, with
    /// the client certificate when the cluster serves TLS.
    fn etcdctl_at(&self, endpoints: &str, args: &[&str]) -> Result<String, String> {
        let mut full: Vec<String> = Vec::new();
        full.extend(self.root.lock().unwrap_or_else(|e| e.into_inner()).clone());
        if let Some(certs) = &self.tls {
            for (flag, file) in [
                ("--cacert", &certs.ca),
                ("--cert", &certs.client_cert),
                ("--key", &certs.client_key),
            ] {
                full.push(format!("{flag}={}", file.display()));
            }
        }
        full.extend(args.iter().map(|a| a.to_string()));
        let full: Vec<&str> = full.iter().map(String::as_str).collect();
        etcdctl(endpoints, &full)
    }

    /// Turns etcd's authentication on, with a `root` user of password
    /// `root_password` (etcd's own guide: the root user first, then
    /// `auth enable`).
    /// `etcdctl` here on as root.
    pub fn enable_auth(&self, root_password: &str) -> Result<(), String> {
        created(self.etcdctl(&["user", "add", &format!("root:{root_password}")]))?;
        self.etcdctl(&["auth", "enable"])?;
        *self.root.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(format!("--user=root:{root_password}"));
        Ok(())
    }

    /// Adds `user` with `password` and a role of the same name allowed to
    /// read and write every key under `prefix` (no key when `None`).
    pub fn add_user(&self, user: &str, password: &str, prefix: Option<&str>) -> Result<(), String> {
        created(self.etcdctl(&["user", "add", &format!("{user}:{password}")]))?;
        created(self.etcdctl(&["role", "add", user]))?;
        if let Some(prefix) = prefix {
            self.etcdctl(&[
                "role",
                "grant-permission",
                user,
                "--prefix=true",
                "readwrite",
                prefix,
            ])?;
        }
        self.etcdctl(&["user", "grant-role", user, user]).map(drop)
    }

    /// Allows `user`'s role (of the same name) to read the key `key`.
    pub fn grant_read(&self, user: &str, key: &str) -> Result<(), String> {
        self.etcdctl(&["role", "grant-permission", user, "read", key])
            .map(drop)
    }

    /// The index of the member that leads now, if one answers as leader.
    pub fn leader(&self) -> Option<usize> {
        let table = self.etcdctl(&["endpoint", "status", "-w", "simple"]).ok()?;
        // One line per member: endpoint, id, version, size, is leader, …
        table.lines().find_map(|line| {
            let fields: Vec<&str> = line.split(", ").collect();
            (fields.get(4) == Some(&"true"))
                .then(|| self.members.iter().position(|m| m.client == fields[0]))
                .flatten()
        })
    }
}

/// An `etcdctl` creation (`user add`, `role add`) done: it succeeded, or
/// found what it creates already there. etcdctl sends a request again
/// when the first one's answer is late (its retry interceptor), and the
/// first may have been applied: on a loaded machine, the second then
/// answers "already exists" for the user or role the first created. Only
/// the tests' setup creates these, in a cluster of their own.
fn created(result: Result<String, String>) -> Result<(), String> {
    match result {
        Ok(_) => Ok(()),
        Err(why) if why.contains("already exists") => Ok(()),
        Err(why) => Err(why),
    }
}

/// The `--initial-cluster-token` of this process's clusters.
fn token() -> String {
    format!("alkstore{}", std::process::id())
}

/// `etcdctl` (Debian's `etcd-client`) at `endpoints` (comma-separated),
/// with `args`.
fn etcdctl(endpoints: &str, args: &[&str]) -> Result<String, String> {
    let endpoints = format!("--endpoints={endpoints}");
    let mut full = vec![endpoints.as_str(), "--command-timeout=5s"];
    full.extend_from_slice(args);
    let mut command = Command::new(process::find_tool("etcdctl").ok_or("no etcdctl")?);
    command.env("ETCDCTL_API", "3");
    let output = command
        .args(&full)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| e.to_string())?;
    match output.status.success() {
        true => Ok(String::from_utf8_lossy(&output.stdout).into_owned()),
        false => Err(String::from_utf8_lossy(&output.stderr).into_owned()),
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("sh").args(["-c", &self.stop]).status();
    }
}

static SERVER: OnceLock<Result<Server, String>> = OnceLock::new();

/// The cluster for this process's tests, or `None` (after printing why)
/// when there is none and etcd is not [required](crate::required).
///
/// # Panics
/// When no cluster can be had and etcd is required.
pub fn server() -> Option<&'static Server> {
    process::found_or_skipped(
        SERVER.get_or_init(find_or_start),
        REQUIRE_NAME,
        &format!("set {URL_VAR}, or install the etcd-server package"),
    )
}

fn find_or_start() -> Result<Server, String> {
    if let Ok(url) = std::env::var(URL_VAR) {
        if !url.is_empty() {
            return Ok(Server { url, cluster: None });
        }
    }
    let cluster = Cluster::start(3)?;
    Ok(Server {
        url: cluster.url(),
        cluster: Some(cluster),
    })
}
