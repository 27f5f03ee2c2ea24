//! Project automation, as a small Rust program instead of shell scripts.
//!
//! - `cargo xtask contract [--from FILE]` — runs the contract suite on every
//!   engine and prints a table of cases × engines; fails if any case fails,
//!   if the engines disagree, or if an engine was skipped while required
//!   (`ALKSTORE_REQUIRE=postgres,mysql` or `all`; the older
//!   `ALKSTORE_REQUIRE_PG=1` still counts for PostgreSQL). The engines are
//!   the workspace's `alkstore-<engine>` packages with a `tests/contract.rs`.
//!   With `--from FILE`, runs nothing: the table is read from the output of
//!   a `cargo test --workspace --all-features` run (`2>&1 | tee FILE`), so
//!   that CI runs each suite once.
//! - `cargo xtask tidy` — what the compiler cannot check: every contract case
//!   listed and documented, case counts in the docs, the docs' SQL against
//!   each engine's `sql.rs`, no unused dependencies, the paths docs cite,
//!   this usage line (also run by `cargo test`: `tidy::tests`).
//! - `cargo xtask ci` — fmt check, clippy `-D warnings`, the full test run,
//!   the quickstart example, the contract table and tidy.
//! - `cargo xtask bench [engine…] [fairness/kept]` — the benchmark (`bench/`;
//!   every engine, or those named; with `fairness`, fair waiting alone;
//!   with `kept`, the kept leases alone),
//!   built with optimizations:
//!   a table of figures next to floors measured in the same run, JSON and
//!   SVG plots under `target/bench/`.
//! - `cargo xtask mutants [args]` — mutation testing of `alkstore-core` with
//!   `cargo-mutants` (installed with `cargo install cargo-mutants`), judged
//!   by the core's unit tests and the contract suite on the reference engine;
//!   not in CI (17–60 s per mutant on 2 cores; 60 s is the timeout). Results in `target/mutants/`.
//! - `cargo xtask protos` — regenerates alkstore-etcd's gRPC code
//!   (`alkstore-etcd/src/proto/`) from `alkstore-etcd/proto/*.proto`, with
//!   a `protoc` from the `protoc-bin-vendored` crate (`xtask/protos/`, a
//!   workspace of its own).
//! - `cargo xtask soak [minutes]` — a mixed workload per engine (4 minutes
//!   each by default): errors, failed opens, checker violations, how long a
//!   lease outlives `KeepAlive`'s loss signal, `lock(wait)` overshoot.

use std::collections::BTreeMap;
use std::process::{Command, ExitCode};

mod contract;
mod tidy;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("contract") => contract::run(&args[1..]),
        Some("tidy") => tidy::run(),
        Some("ci") => ci(),
        Some("bench") => {
            let mut command = vec![
                "run",
                "--release",
                "-p",
                "alkstore-bench",
                "--",
                "target/bench",
            ];
            command.extend(args[1..].iter().map(String::as_str));
            cargo(&command)
        }
        Some("mutants") => {
            // The core, mutated; its unit tests and the contract suite on the
            // in-memory reference engine judge each mutant (the gallery is
            // left out: it tests the suite, not the core). Extra arguments
            // (`-f FILE`, `--list`, `-j N`) go to cargo-mutants.
            let mut command = vec![
                "mutants",
                "--package",
                "alkstore-core",
                "--test-package",
                "alkstore-core",
                "--test-package",
                "alkstore-contract-suite",
                "--timeout",
                "60",
                "--output",
                "target/mutants",
            ];
            command.extend(args[1..].iter().map(String::as_str));
            command.extend([
                "--",
                "--",
                "--skip",
                "every_flaw_is_rejected_by_exactly_its_cases",
            ]);
            cargo(&command)
        }
        Some("protos") => {
            // alkstore-etcd's gRPC code, from its .proto files: a workspace
            // of its own, so that its build tools (a vendored protoc,
            // prost-build) never enter the project's builds.
            cargo(&["run", "--manifest-path", "xtask/protos/Cargo.toml"])
        }
        Some("soak") => {
            let minutes = args.get(1).map(String::as_str).unwrap_or("4");
            cargo(&[
                "run",
                "--release",
                "-p",
                "alkstore-bench",
                "--bin",
                "soak",
                "--",
                minutes,
            ])
        }
        _ => {
            eprintln!(
                "usage: cargo xtask <contract [--from FILE] | tidy | ci | bench [engine…] [fairness/kept] | mutants [args] | soak [minutes] | protos>"
            );
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(why) => {
            eprintln!("xtask: {why}");
            ExitCode::FAILURE
        }
    }
}

/// Runs `cargo args`, streaming its output; an error when it fails.
pub(crate) fn cargo(args: &[&str]) -> Result<(), String> {
    eprintln!("xtask: cargo {}", args.join(" "));
    let status = Command::new(env!("CARGO"))
        .args(args)
        .status()
        .map_err(|e| format!("could not run cargo: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("cargo {} failed ({status})", args.join(" ")))
    }
}

/// Runs `cargo args` with its output (stdout and stderr together, in the
/// order written, as `2>&1 | tee` keeps it) written to `file`, and shown
/// as it comes.
fn cargo_recorded(args: &[&str], file: &std::path::Path) -> Result<(), String> {
    use std::io::{Read, Write};
    eprintln!(
        "xtask: cargo {} (output kept in {})",
        args.join(" "),
        file.display()
    );
    let failed = |e: std::io::Error| format!("could not run cargo {}: {e}", args.join(" "));
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir).map_err(failed)?;
    }
    // Both streams to one open file, appending: their writes land in the
    // order they were made, and lines a test writes to /dev/stderr (past
    // the harness's capture: `SKIPPED:`, `OPTED OUT:`) open the file anew
    // and append too, rather than being overwritten at a stale offset.
    std::fs::File::create(file).map_err(failed)?;
    let kept = std::fs::OpenOptions::new()
        .append(true)
        .open(file)
        .map_err(failed)?;
    let mut child = Command::new(env!("CARGO"))
        .args(args)
        .stdout(kept.try_clone().map_err(failed)?)
        .stderr(kept)
        .spawn()
        .map_err(failed)?;
    let mut shown = std::fs::File::open(file).map_err(failed)?;
    let mut buffer = Vec::new();
    let status = loop {
        let exited = child.try_wait().map_err(failed)?;
        buffer.clear();
        shown.read_to_end(&mut buffer).map_err(failed)?;
        std::io::stdout().write_all(&buffer).map_err(failed)?;
        match exited {
            Some(status) => break status,
            None => std::thread::sleep(std::time::Duration::from_millis(200)),
        }
    };
    match status.success() {
        true => Ok(()),
        false => Err(format!("cargo {} failed ({status})", args.join(" "))),
    }
}

fn ci() -> Result<(), String> {
    cargo(&["fmt", "--all", "--", "--check"])?;
    cargo(&[
        "clippy",
        "--workspace",
        "--all-targets",
        "--all-features",
        "--",
        "-D",
        "warnings",
    ])?;
    // The tests once, their output kept for the contract table.
    let recorded = workspace_root().join("target/test-output.txt");
    cargo_recorded(&["test", "--workspace", "--all-features"], &recorded)?;
    cargo(&["run", "--quiet", "--example", "quickstart"])?;
    contract::run(&["--from".into(), recorded.display().to_string()])?;
    tidy::run()
}

/// Outcome of one case on one engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Pass,
    Fail,
    Skipped,
    /// The engine's fixture opted out of the case by name (`Fresh::opting_out`).
    OptedOut,
}

/// Cases × engines.
pub(crate) type Table = BTreeMap<String, BTreeMap<String, Outcome>>;

/// The workspace's root directory (xtask lives one level below it).
pub(crate) fn workspace_root() -> std::path::PathBuf {
    // Read at run time (`cargo run` sets it): the compile-time value names
    // whichever checkout built this binary, and a target directory shared
    // between checkouts keeps that binary for the other.
    let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into());
    manifest_dir
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}
