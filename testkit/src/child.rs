//! A holder in another process, killed with SIGKILL while it holds a lock:
//! the test binary runs one of its own ignored tests as the child.
//!
//! ```no_run
//! // In the parent test:
//! let fence = alkstore_testkit::child::hold_in_child_and_kill(
//!     "child_holds_until_killed",
//!     &[("MY_TEST_DB", "/tmp/x.db")],
//! );
//! // In the child, an `#[ignore]`d test named `child_holds_until_killed`,
//! // once its lock is granted with `fence`:
//! # async fn child(fence: u64) {
//! alkstore_testkit::child::report_held_and_hang(fence).await;
//! # }
//! ```

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

/// The line the child prints once it holds its lock.
const HELD: &str = "HELD ";

/// Runs this test binary's ignored test `test` in a child process with
/// `env` added, waits until it reports its grant, kills it with SIGKILL and
/// reaps it; the grant's fence.
///
/// # Panics
/// When the child cannot be started or exits before it reports a grant.
pub fn hold_in_child_and_kill(test: &str, env: &[(&str, &str)]) -> u64 {
    let mut child = spawn(test, env);
    let stdout = child.child.stdout.take().unwrap();
    let fence = fence_in(BufReader::new(stdout).lines().map_while(Result::ok), HELD);
    child.kill();
    fence.expect("the child reports its grant before it ends")
}

/// The fence of the first of `lines` that starts with `prefix`.
fn fence_in(mut lines: impl Iterator<Item = String>, prefix: &str) -> Option<u64> {
    lines.find_map(|line| line.strip_prefix(prefix).map(|f| f.trim().parse().unwrap()))
}

/// Says `prefix` and `fence` on its own line of the child's output.
fn report(prefix: &str, fence: u64) {
    let mut stdout = std::io::stdout();
    let _ = writeln!(stdout, "{prefix}{fence}");
    let _ = stdout.flush();
}

/// The child's side: says it holds the grant with `fence`, then hangs until
/// the parent kills it.
pub async fn report_held_and_hang(fence: u64) -> ! {
    report(HELD, fence);
    std::future::pending::<()>().await;
    unreachable!("pending never completes")
}

/// The line a waiting child prints once its waiting call is granted.
const GRANTED: &str = "GRANTED ";

/// A child process running one of this test binary's ignored tests (a
/// waiter in another process): [`spawn`], then [`Child::granted`] or
/// [`Child::kill`].
#[derive(Debug)]
pub struct Child {
    child: std::process::Child,
}

/// Runs this test binary's ignored test `test` in a child process with
/// `env` added; the child reports its grant with [`report_granted`].
///
/// # Panics
/// When the child cannot be started.
pub fn spawn(test: &str, env: &[(&str, &str)]) -> Child {
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--ignored", "--nocapture", "--quiet"])
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the child test");
    Child { child }
}

impl Child {
    /// Waits for the child to report its grant and to end; the grant's
    /// fence. Blocking: call it off the async runtime's threads.
    ///
    /// # Panics
    /// When the child ends without reporting a grant, or fails.
    pub fn granted(mut self) -> u64 {
        let stdout = self.child.stdout.take().unwrap();
        // Read to the end: a pipe closed early would fail the child's
        // later prints.
        let lines: Vec<String> = BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .collect();
        let fence = fence_in(lines.into_iter(), GRANTED);
        let status = self.child.wait().expect("reap the child");
        assert!(status.success(), "the child failed: {status}");
        fence.expect("the child reports its grant before it ends")
    }

    /// Kills the child with SIGKILL and reaps it.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The waiting child's side: says it was granted with `fence`.
pub fn report_granted(fence: u64) {
    report(GRANTED, fence);
}
