//! A Patroni cluster for failover tests: one etcd (Patroni's store), two
//! PostgreSQL nodes each run by its Patroni, and HAProxy routing to the
//! leader through Patroni's REST check (`/primary`) — as most Patroni
//! deployments are built — started from the installed packages (`etcd`,
//! `patroni`, `haproxy`, PostgreSQL's server binaries) in a temp dir, on
//! free loopback ports, and removed by a watchdog once this process exits.
//!
//! Patroni's timings are short (`ttl` 10 s, `loop_wait` 1 s,
//! `retry_timeout` 3 s) so that a crash fails over in seconds; HAProxy
//! checks every 300 ms and ends the sessions of a server marked down.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::process;

/// What `ALKSTORE_REQUIRE` names to make these tests fail rather than skip.
pub const REQUIRE_NAME: &str = "patroni";

/// How long a cluster may take to start (initdb, a copy per standby): a
/// bound on a setup step, generous for a loaded machine, not a timing
/// assertion.
const STARTUP: Duration = Duration::from_secs(300);

/// How the cluster replicates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    /// Asynchronous (Patroni's default).
    Asynchronous,
    /// `synchronous_mode: true`, `synchronous_mode_strict: true`: commits
    /// wait for the synchronous standby, also when none is left.
    SynchronousStrict,
    /// `synchronous_mode: true` alone: Patroni empties
    /// `synchronous_standby_names` when the standby goes away.
    Synchronous,
}

/// One PostgreSQL node and its Patroni.
#[derive(Debug)]
pub struct Node {
    /// Patroni's member name (`node0`, `node1`).
    pub name: String,
    /// Its directory (Patroni's configuration and log, the data directory,
    /// the socket).
    pub dir: PathBuf,
    /// PostgreSQL's port.
    pub port: u16,
    /// Patroni's REST API port.
    pub rest_port: u16,
    /// The superuser's URL straight to this node.
    pub url: String,
}

impl Node {
    fn config(&self) -> PathBuf {
        self.dir.join("patroni.yml")
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// A `pkill -f` pattern for this node's Patroni (and the `runuser`
    /// that started it): its configuration's path, the last character in
    /// brackets, so that the pattern does not match the command line of the
    /// shell that runs the `pkill` (a watchdog's `sh -c`), which holds the
    /// pattern itself and would otherwise be killed before the rest of its
    /// stop ran.
    fn process_pattern(&self) -> String {
        let config = self.config().display().to_string();
        let (head, last) = config.split_at(config.len() - 1);
        format!("{head}[{last}]")
    }

    /// The HTTP status Patroni's REST API answers `GET path` with.
    pub fn rest_status(&self, path: &str) -> Result<u16, String> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.rest_port))
            .map_err(|e| format!("{}'s REST API: {e}", self.name))?;
        stream
            .set_read_timeout(Some(Duration::from_secs(2)))
            .map_err(|e| e.to_string())?;
        write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .map_err(|e| e.to_string())?;
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        answer
            .split_whitespace()
            .nth(1)
            .and_then(|code| code.parse().ok())
            .ok_or_else(|| format!("{}'s REST API answered {answer:?}", self.name))
    }
}

/// A running Patroni cluster.
#[derive(Debug)]
pub struct Cluster {
    /// Its directory.
    pub dir: PathBuf,
    /// The superuser's URL through HAProxy (to the leader).
    pub url: String,
    /// The nodes.
    pub nodes: Vec<Node>,
    /// etcd's client endpoint (`127.0.0.1:port`).
    pub etcd: String,
    /// Whether Patroni and PostgreSQL run as the `postgres` user.
    as_postgres: bool,
    /// The shell command that stops every process of the cluster.
    stop: String,
}

impl Cluster {
    /// Stops every process of the cluster, as dropping it does, and answers
    /// which are still there after (none, unless the stop is broken).
    pub fn stop(mut self) -> Vec<String> {
        let read = |path: PathBuf| {
            std::fs::read_to_string(path)
                .ok()
                .and_then(|pid| pid.lines().next().map(|l| l.trim().to_owned()))
                .unwrap_or_default()
        };
        let mut pids: Vec<(String, String)> = self
            .nodes
            .iter()
            .map(|n| {
                (
                    format!("{}'s postmaster", n.name),
                    read(n.data().join("postmaster.pid")),
                )
            })
            .collect();
        for name in ["etcd", "haproxy"] {
            pids.push((name.to_owned(), read(self.dir.join(format!("{name}.pid")))));
        }
        let _ = Command::new("sh").args(["-c", &self.stop]).status();
        // Stopped: dropping it stops nothing more.
        self.stop.clear();
        let mut left: Vec<String> = pids
            .into_iter()
            .filter(|(_, pid)| alive(pid))
            .map(|(what, pid)| format!("{what} ({pid})"))
            .collect();
        for node in &self.nodes {
            let patroni = Command::new("pgrep")
                .args(["-f", &node.process_pattern()])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
                .unwrap_or_default();
            if !patroni.is_empty() {
                left.push(format!("{}'s Patroni ({patroni})", node.name));
            }
        }
        left
    }
}

/// Whether the process `pid` runs (and is no zombie), waiting up to 5 s
/// for one that was just killed to go.
fn alive(pid: &str) -> bool {
    if pid.is_empty() {
        return false;
    }
    let running = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            !stat
                .rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
    };
    process::until(Duration::from_secs(5), "a killed process to go", || {
        Ok(!running())
    })
    .is_err()
}

impl Drop for Cluster {
    /// Stops the cluster's processes at once (the watchdog removes the
    /// directory when this process ends): a test's cluster does not load
    /// the next test's machine.
    fn drop(&mut self) {
        if self.stop.is_empty() {
            return;
        }
        let _ = Command::new("sh")
            .args(["-c", &self.stop])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

impl Cluster {
    /// Starts etcd, `nodes` nodes and HAProxy, and waits until the leader
    /// answers through HAProxy and every other node streams from it (one as
    /// its synchronous standby, when synchronous). `None` (the reason printed,
    /// or a panic when Patroni is required) when a package is missing.
    pub fn start(replication: Replication, nodes: usize) -> Option<Cluster> {
        if std::env::var(crate::pg::URL_VAR).is_ok_and(|url| !url.is_empty()) {
            eprintln!(
                "SKIPPED: a Patroni test needs clusters of its own, not {}",
                crate::pg::URL_VAR
            );
            return None;
        }
        let missing = ["etcd", "patroni", "patronictl", "haproxy"]
            .into_iter()
            .find(|tool| process::find_tool(tool).is_none());
        let bin = crate::pg::server_bin_dir();
        let why = match (missing, &bin) {
            (Some(tool), _) => Some(format!("no {tool} binary found")),
            (None, None) => Some("no PostgreSQL server binaries found".to_owned()),
            (None, Some(_)) => None,
        };
        if let Some(why) = why {
            process::skip_or_fail(
                REQUIRE_NAME,
                &why,
                "install the etcd-server, patroni and haproxy packages",
            );
            return None;
        }
        Some(start(replication, nodes, &bin.expect("checked")).expect("start a Patroni cluster"))
    }

    fn user(&self) -> Option<&'static str> {
        self.as_postgres.then_some("postgres")
    }

    /// The index of the node Patroni's REST API calls the primary now, if one.
    pub fn leader(&self) -> Option<usize> {
        self.nodes
            .iter()
            .position(|n| n.rest_status("/primary") == Ok(200))
    }

    /// Runs `patronictl` with `args` on this cluster's configuration.
    pub fn patronictl(&self, args: &[&str]) -> Result<String, String> {
        let config = self.nodes[0].config();
        let mut full = vec!["-c", config.to_str().ok_or("temp dir not UTF-8")?];
        full.extend_from_slice(args);
        process::output(
            &process::find_tool("patronictl").ok_or("no patronictl")?,
            &full,
            self.user(),
        )
    }

    /// A planned switchover to node `to` (`patronictl switchover --force`;
    /// in synchronous mode, the synchronous standby), returned once Patroni
    /// says it is done.
    pub fn switchover(&self, to: usize) -> Result<(), String> {
        let leader = self.leader().ok_or("no leader to switch over from")?;
        self.patronictl(&[
            "switchover",
            "--leader",
            &self.nodes[leader].name,
            "--candidate",
            &self.nodes[to].name,
            "--force",
        ])
        .and_then(|out| match out.contains("Switchover failed") {
            true => Err(format!("patronictl switchover: {out}")),
            false => Ok(()),
        })
    }

    /// Node `index` dies: its Patroni and its postmaster killed with
    /// SIGKILL (no shutdown, no release of the leader key, which expires
    /// after `ttl`).
    /// Its server processes die with it, in one `kill`: a stopped one (see
    /// [`Cluster::hold_replication`]) would not notice its postmaster gone.
    pub fn crash(&self, index: usize) -> Result<(), String> {
        let node = &self.nodes[index];
        let _ = Command::new("pkill")
            .args(["-KILL", "-f", &node.process_pattern()])
            .status();
        let pid = std::fs::read_to_string(node.data().join("postmaster.pid"))
            .map_err(|e| format!("{}'s postmaster.pid: {e}", node.name))?;
        let pid = pid.lines().next().unwrap_or_default().trim().to_owned();
        // pgrep answers 1 when the postmaster has no child: none to add.
        let children = process::output(Path::new("pgrep"), &["-P", &pid], None).unwrap_or_default();
        let mut pids = vec!["-KILL", pid.as_str()];
        pids.extend(children.split_whitespace());
        // A child may end by itself between the two (a backend that had
        // finished): `kill` then fails for that pid alone, having killed
        // the rest. What matters is that the postmaster is gone.
        let _ = process::run(Path::new("kill"), &pids, None);
        process::until(Duration::from_secs(10), "the postmaster to die", || {
            Ok(process::run(Path::new("kill"), &["-0", &pid], None).is_err())
        })?;
        // Gone with its process: a later stop must not kill whatever takes
        // the pid over.
        let _ = std::fs::remove_file(node.data().join("postmaster.pid"));
        Ok(())
    }

    /// Stops (SIGSTOP) node `index`'s walsenders: what it commits from now
    /// on reaches no standby, as when its network to them is cut. Undone
    /// only by [`Cluster::crash`].
    pub fn hold_replication(&self, index: usize) -> Result<(), String> {
        let pids = self.query(
            index,
            "SELECT string_agg(pid::text, ' ') FROM pg_stat_replication",
        )?;
        let mut args = vec!["-STOP"];
        args.extend(pids.split_whitespace());
        if args.len() == 1 {
            return Err(format!("{} has no walsender", self.nodes[index].name));
        }
        process::run(Path::new("kill"), &args, None)
    }

    /// Waits until every standby has replayed what the leader had written
    /// when this was called.
    pub fn until_replayed(&self, patience: Duration) -> Result<(), String> {
        let leader = self.leader().ok_or("no leader")?;
        let written = self.query(leader, "SELECT pg_current_wal_lsn()")?;
        let others = (self.nodes.len() - 1).to_string();
        let replayed = format!(
            "SELECT count(*) FROM pg_stat_replication WHERE application_name LIKE 'node%' \
             AND replay_lsn >= '{written}'::pg_lsn"
        );
        process::until(patience, "the standbys to replay", || {
            Ok(self.query(leader, &replayed).is_ok_and(|n| n == others))
        })
    }

    /// Waits until a node other than `not` is the primary and HAProxy routes
    /// to it; its index.
    pub fn until_new_leader(&self, not: usize, patience: Duration) -> Result<usize, String> {
        let mut found = None;
        process::until(patience, "a new leader", || {
            found = self.leader().filter(|&l| l != not);
            Ok(found.is_some_and(|l| self.routes_to(l)))
        })
        .map_err(|e| format!("{e}; patronictl list: {:?}", self.patronictl(&["list"])))?;
        found.ok_or_else(|| "no new leader".into())
    }

    /// Whether HAProxy routes to node `index` now, and it is out of
    /// recovery (one fresh connection's server port and recovery state):
    /// Patroni's REST API calls a node the primary once it holds the
    /// leader key, a moment before its promotion ends, when writes still
    /// fail with "recovery is in progress".
    fn routes_to(&self, index: usize) -> bool {
        self.query_via_haproxy("SELECT inet_server_port() || ' ' || pg_is_in_recovery()")
            .is_ok_and(|answer| answer == format!("{} false", self.nodes[index].port))
    }

    /// The first value `sql` answers through HAProxy (`psql` over TCP).
    fn query_via_haproxy(&self, sql: &str) -> Result<String, String> {
        let mut command = process::command_as(None, Path::new("psql"));
        let output = command
            .args([self.url.as_str(), "-Atc", sql])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| e.to_string())?;
        match output.status.success() {
            true => Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned()),
            false => Err(String::from_utf8_lossy(&output.stderr).into_owned()),
        }
    }

    /// The first value `sql` answers on node `index`, as the superuser over
    /// its socket.
    pub fn query(&self, index: usize, sql: &str) -> Result<String, String> {
        let node = &self.nodes[index];
        let (port, dir) = (node.port.to_string(), node.dir.display().to_string());
        let args = [
            "-h", &dir, "-p", &port, "-U", "postgres", "-d", "postgres", "-Atc", sql,
        ];
        process::output(Path::new("psql"), &args, self.user()).map(|out| out.trim().to_owned())
    }

    /// Waits until the leader sees every other node streaming (one as its
    /// synchronous standby, with `synchronous`, and so named by Patroni).
    pub fn until_streaming(&self, synchronous: bool, patience: Duration) -> Result<(), String> {
        // Only the nodes' own walsenders (a copy in progress streams too,
        // as `pg_basebackup`, and counts as synchronous under `'*'`).
        let ready = "SELECT count(*) FILTER (WHERE state = 'streaming') || ' ' || \
                     count(*) FILTER (WHERE sync_state = 'sync') FROM pg_stat_replication \
                     WHERE application_name LIKE 'node%'";
        let others = self.nodes.len() - 1;
        let expected = format!("{others} {}", usize::from(synchronous));
        process::until(patience, "the standbys to stream", || {
            Ok(self
                .leader()
                .is_some_and(|l| self.query(l, ready).is_ok_and(|n| n == expected))
                && (!synchronous || self.synchronous_standby().is_some()))
        })
    }

    /// The index of the node Patroni names the synchronous standby now
    /// (its REST API's `/sync` answers 200), if one.
    pub fn synchronous_standby(&self) -> Option<usize> {
        self.nodes
            .iter()
            .position(|n| n.rest_status("/sync") == Ok(200))
    }
}

fn start(replication: Replication, count: usize, bin: &Path) -> Result<Cluster, String> {
    let as_postgres = process::is_root();
    let dir = process::kept_temp_dir("alkstore-patroni-")?;
    let password = process::random_password()?;
    let scope = format!("alkstore{}", std::process::id());
    let (etcd_port, peer_port) = (process::free_port()?, process::free_port()?);
    let etcd = format!("127.0.0.1:{etcd_port}");
    let mut nodes = Vec::new();
    for i in 0..count {
        let name = format!("node{i}");
        let node_dir = dir.join(&name);
        std::fs::create_dir_all(&node_dir).map_err(|e| e.to_string())?;
        let port = process::free_port()?;
        nodes.push(Node {
            url: format!("postgres://postgres:{password}@127.0.0.1:{port}/postgres"),
            name,
            dir: node_dir,
            port,
            rest_port: process::free_port()?,
        });
    }
    let (synchronous, strict) = match replication {
        Replication::Asynchronous => (false, false),
        Replication::SynchronousStrict => (true, true),
        Replication::Synchronous => (true, false),
    };
    for node in &nodes {
        let yaml = format!(
            "scope: {scope}
name: {name}
log:
  dir: {dir}
restapi:
  listen: 127.0.0.1:{rest}
  connect_address: 127.0.0.1:{rest}
etcd3:
  hosts: {etcd}
bootstrap:
  dcs:
    ttl: 10
    loop_wait: 1
    retry_timeout: 3
    maximum_lag_on_failover: 1073741824
    synchronous_mode: {synchronous}
    synchronous_mode_strict: {strict}
    postgresql:
      use_pg_rewind: false
      parameters:
        max_connections: 400
        wal_level: replica
        max_wal_senders: 10
        max_replication_slots: 10
  initdb:
  - encoding: UTF8
  - locale: C
  pg_hba:
  - local all all trust
  - host all all 127.0.0.1/32 scram-sha-256
  - host replication replicator 127.0.0.1/32 scram-sha-256
postgresql:
  listen: 127.0.0.1:{port}
  connect_address: 127.0.0.1:{port}
  data_dir: {dir}/data
  bin_dir: {bin}
  pgpass: {dir}/pgpass
  authentication:
    superuser:
      username: postgres
      password: {password}
    replication:
      username: replicator
      password: {password}
  parameters:
    unix_socket_directories: {dir}
",
            name = node.name,
            dir = node.dir.display(),
            rest = node.rest_port,
            port = node.port,
            bin = bin.display(),
        );
        std::fs::write(node.config(), yaml).map_err(|e| format!("patroni.yml: {e}"))?;
    }
    let haproxy_port = process::free_port()?;
    let mut haproxy = format!(
        "global
  maxconn 2000
defaults
  mode tcp
  timeout connect 2s
  timeout client 30m
  timeout server 30m
  timeout check 1s
listen primary
  bind 127.0.0.1:{haproxy_port}
  option httpchk GET /primary
  http-check expect status 200
  default-server inter 300ms fall 2 rise 1 on-marked-down shutdown-sessions
"
    );
    for node in &nodes {
        haproxy += &format!(
            "  server {} 127.0.0.1:{} check port {}\n",
            node.name, node.port, node.rest_port
        );
    }
    std::fs::write(dir.join("haproxy.cfg"), haproxy).map_err(|e| format!("haproxy.cfg: {e}"))?;
    if as_postgres {
        let path = dir.to_str().ok_or("temp dir not UTF-8")?;
        process::run(Path::new("chown"), &["-R", "postgres:", path], None)?;
    }
    // Whatever happens to this process, everything stops and goes; the pid
    // files go with their processes, so that a second run (the watchdog's,
    // after a drop) kills no process that took a pid over since.
    let mut stop = String::new();
    for node in &nodes {
        stop += &format!(
            "pkill -KILL -f '{pattern}'; kill -KILL $(head -n 1 '{data}/postmaster.pid' 2>/dev/null) 2>/dev/null; rm -f '{data}/postmaster.pid'; ",
            pattern = node.process_pattern(),
            data = node.data().display(),
        );
    }
    stop += &format!(
        "kill $(cat '{d}/haproxy.pid' 2>/dev/null) 2>/dev/null; kill $(cat '{d}/etcd.pid' 2>/dev/null) 2>/dev/null; rm -f '{d}/haproxy.pid' '{d}/etcd.pid'",
        d = dir.display()
    );
    process::spawn_watchdog(&stop, &dir)?;
    // Until the cluster is built, a failure stops what started.
    let stop_on_error = process::StopOnError::new(stop.clone());
    // Standard output and error, both to one log file.
    let log = |name: &str| -> Result<(Stdio, Stdio), String> {
        let file = std::fs::File::create(dir.join(name)).map_err(|e| format!("{name}: {e}"))?;
        let again = file.try_clone().map_err(|e| format!("{name}: {e}"))?;
        Ok((file.into(), again.into()))
    };
    let (out, err) = log("etcd.log")?;
    let etcd_child = Command::new(process::find_tool("etcd").ok_or("no etcd")?)
        .args([
            "--name",
            "e0",
            "--data-dir",
            dir.join("etcd").to_str().ok_or("temp dir not UTF-8")?,
            "--listen-client-urls",
            &format!("http://{etcd}"),
            "--advertise-client-urls",
            &format!("http://{etcd}"),
            "--listen-peer-urls",
            &format!("http://127.0.0.1:{peer_port}"),
            "--initial-advertise-peer-urls",
            &format!("http://127.0.0.1:{peer_port}"),
            "--initial-cluster",
            &format!("e0=http://127.0.0.1:{peer_port}"),
        ])
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("could not start etcd: {e}"))?;
    std::fs::write(dir.join("etcd.pid"), etcd_child.id().to_string()).map_err(|e| e.to_string())?;
    process::until(Duration::from_secs(20), "etcd to listen", || {
        Ok(TcpStream::connect(&etcd).is_ok())
    })?;
    let user = as_postgres.then_some("postgres");
    for (i, node) in nodes.iter().enumerate() {
        let (out, err) = log(&format!("{}.out", node.name))?;
        process::command_as(user, &process::find_tool("patroni").ok_or("no patroni")?)
            .arg(node.config())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("could not start patroni: {e}"))?;
        if i == 0 {
            // The first node bootstraps the cluster; the others copy it.
            process::until(STARTUP, "the first node to lead", || {
                Ok(node.rest_status("/primary") == Ok(200))
            })
            .map_err(|e| format!("{e}; {}", tail(&node.dir.join("patroni.log"))))?;
        }
    }
    process::run(
        &process::find_tool("haproxy").ok_or("no haproxy")?,
        &[
            "-f",
            dir.join("haproxy.cfg")
                .to_str()
                .ok_or("temp dir not UTF-8")?,
            "-D",
            "-p",
            dir.join("haproxy.pid")
                .to_str()
                .ok_or("temp dir not UTF-8")?,
        ],
        None,
    )?;
    let cluster = Cluster {
        url: format!("postgres://postgres:{password}@127.0.0.1:{haproxy_port}/postgres"),
        dir,
        nodes,
        etcd,
        as_postgres,
        stop: stop_on_error.defuse(),
    };
    cluster
        .until_streaming(synchronous, STARTUP)
        .map_err(|e| format!("{e}; {}", tail(&cluster.nodes[1].dir.join("patroni.log"))))?;
    process::until(STARTUP, "HAProxy to route", || {
        Ok(cluster.leader().is_some_and(|l| cluster.routes_to(l)))
    })?;
    Ok(cluster)
}

/// The last lines of a log, for an error.
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}
