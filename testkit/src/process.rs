//! What every throwaway server needs: running its tools as its own user,
//! a password and a port nobody else knows, a watchdog that removes it
//! however this process ends, and one way to skip or fail when there is none.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Whether this process runs as root (servers then run as their own user).
pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// A command for `program`, run as `user` (through `runuser`) when given.
pub fn command_as(user: Option<&str>, program: &Path) -> Command {
    match user {
        Some(user) => {
            let mut c = Command::new("runuser");
            c.args(["-u", user, "--"]).arg(program);
            c
        }
        None => Command::new(program),
    }
}

/// The installed program `name`: on the PATH, or in `/usr/sbin` or
/// `/usr/bin` (Debian puts servers in `/usr/sbin`, which a user's PATH may
/// lack).
pub fn find_tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/usr/bin".into()])
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// Runs `program args` (as `user` when given) to its end; the error holds
/// its output.
pub fn run(program: &Path, args: &[&str], user: Option<&str>) -> Result<(), String> {
    output(program, args, user).map(drop)
}

/// Runs `program` with `args` (as `user`, when given) and answers its
/// standard output; a failure holds the exit status and both outputs.
pub fn output(program: &Path, args: &[&str], user: Option<&str>) -> Result<String, String> {
    let output = command_as(user, program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("could not run {}: {e}", program.display()))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
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

/// Gives `path` to `user` (a server's own user, when this process is root).
pub fn hand_to(user: &str, path: &Path) -> Result<(), String> {
    let path = path.to_str().ok_or("the temp dir's path is not UTF-8")?;
    run(Path::new("chown"), &[&format!("{user}:"), path], None)
}

/// A new directory under the system's temp dir, named `prefix` and a
/// random tail, kept (a watchdog removes it: [`spawn_watchdog`]).
pub fn kept_temp_dir(prefix: &str) -> Result<PathBuf, String> {
    Ok(tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .map_err(|e| format!("no temp dir: {e}"))?
        .keep())
}

/// 32 hex digits from the system's random source.
pub fn random_password() -> Result<String, String> {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| format!("no random source for the server's password: {e}"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// A loopback port nothing listens on right now, and none this process
/// was given before: the kernel may hand a port just let go of out again
/// (two members of one etcd cluster were once given the same port), and
/// the server it was given for may not listen on it yet.
pub fn free_port() -> Result<u16, String> {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..100 {
        let listener =
            TcpListener::bind("127.0.0.1:0").map_err(|e| format!("no free port: {e}"))?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        if !given.contains(&port) {
            given.push(port);
            return Ok(port);
        }
    }
    Err("no free port this process was not given before, in 100 tries".into())
}

/// Runs the shell command `stop` and removes `dir` once this process is
/// gone, however it ends. The watchdog's output goes nowhere, so it holds no
/// test pipe open, and it runs in a session of its own (setsid): a signal to
/// the test's process group, such as a timeout or Ctrl-C, must not take it
/// down with it.
pub fn spawn_watchdog(stop: &str, dir: &Path) -> Result<(), String> {
    let script = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 1; done; {stop}; rm -rf '{dir}'",
        pid = std::process::id(),
        dir = dir.display()
    );
    Command::new("setsid")
        .args(["sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map(drop)
        .map_err(|e| format!("could not start the server watchdog: {e}"))
}

/// What a test does when `engine`'s server cannot be had (`why`): fail when
/// the engine is [required](crate::required); otherwise say `SKIPPED:` once
/// per process — past the test harness's output capture (through
/// /dev/stderr), so that a plain `cargo test` shows it — and skip.
///
/// # Panics
/// When the engine is required.
pub fn skip_or_fail(engine: &str, why: &str, hint: &str) {
    if crate::required(engine) {
        panic!(
            "{engine} is required ({}={engine}) but unavailable: {why}",
            crate::REQUIRE_VAR
        );
    }
    static SAID: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut said = SAID.lock().unwrap_or_else(|e| e.into_inner());
    if said.iter().any(|e| e == engine) {
        return;
    }
    said.push(engine.to_owned());
    use std::io::Write;
    let line = format!("SKIPPED: {engine} tests skipped: {why} ({hint})");
    let direct = std::fs::OpenOptions::new()
        .append(true)
        .open("/dev/stderr")
        // One write, line and newline: lines of tests running at once
        // never interleave.
        .and_then(|mut stderr| stderr.write_all(format!("{line}\n").as_bytes()));
    if direct.is_err() {
        eprintln!("{line}");
    }
}

/// The server `found` holds, or `None` after [`skip_or_fail`] said why for
/// `engine` (with `hint`): what each module's `server()` answers.
///
/// # Panics
/// When there is no server and `engine` is required.
pub fn found_or_skipped<T>(
    found: &'static Result<T, String>,
    engine: &str,
    hint: &str,
) -> Option<&'static T> {
    match found {
        Ok(server) => Some(server),
        Err(why) => {
            skip_or_fail(engine, why, hint);
            None
        }
    }
}

/// Polls `ready` every 20 ms until it answers true, for at most `patience`;
/// an error of `ready` ends the wait with it.
pub fn until(
    patience: std::time::Duration,
    what: &str,
    mut ready: impl FnMut() -> Result<bool, String>,
) -> Result<(), String> {
    let deadline = std::time::Instant::now() + patience;
    while !ready()? {
        if std::time::Instant::now() > deadline {
            return Err(format!("waited {patience:?} for {what}"));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Ok(())
}

/// Runs a stop command (`sh -c`) when dropped before
/// [`StopOnError::defuse`]: what a half-built cluster started is stopped.
#[derive(Debug)]
pub struct StopOnError(Option<String>);

impl StopOnError {
    /// Arms `stop`.
    pub fn new(stop: String) -> Self {
        StopOnError(Some(stop))
    }

    /// The build succeeded: nothing to stop; the command, for the caller
    /// to keep.
    pub fn defuse(mut self) -> String {
        self.0.take().unwrap_or_default()
    }
}

impl Drop for StopOnError {
    fn drop(&mut self) {
        if let Some(stop) = self.0.take() {
            let _ = Command::new("sh").args(["-c", &stop]).status();
        }
    }
}
