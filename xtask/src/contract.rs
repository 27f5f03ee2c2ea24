//! `cargo xtask contract`: the contract suite on every engine, side by side.

use std::process::Command;

use crate::{Outcome, Table};

/// The engines of the workspace and the package that runs the suite on
/// each: every `alkstore-<engine>` package with a `tests/contract.rs`, found
/// on disk, so that a new engine crate needs no line here.
pub(crate) fn engines() -> Result<Vec<(String, String)>, String> {
    let root = crate::workspace_root();
    let mut found = Vec::new();
    let dirs =
        std::fs::read_dir(&root).map_err(|e| format!("cannot list {}: {e}", root.display()))?;
    for dir in dirs.flatten() {
        let manifest = std::fs::read_to_string(dir.path().join("Cargo.toml")).unwrap_or_default();
        let package = manifest
            .lines()
            .find_map(|l| l.strip_prefix("name = \""))
            .and_then(|rest| rest.strip_suffix('"'));
        let (Some(package), true) = (package, dir.path().join("tests/contract.rs").is_file())
        else {
            continue;
        };
        if let Some(engine) = package.strip_prefix("alkstore-") {
            found.push((engine.to_owned(), package.to_owned()));
        }
    }
    // The embedded default first, then the servers by name.
    found.sort_by_key(|(engine, _)| (engine != "sqlite", engine.clone()));
    if found.is_empty() {
        return Err("no engine package with tests/contract.rs found".into());
    }
    Ok(found)
}

/// As `alkstore_testkit::required` (xtask stays free of the workspace's
/// dependencies): named in `ALKSTORE_REQUIRE` or `all`; for `postgres`,
/// also `ALKSTORE_REQUIRE_PG=1`.
fn required(engine: &str) -> bool {
    let listed = std::env::var("ALKSTORE_REQUIRE").unwrap_or_default();
    listed
        .split(',')
        .any(|name| matches!(name.trim(), "all") || name.trim() == engine)
        || (engine == "postgres" && std::env::var("ALKSTORE_REQUIRE_PG").as_deref() == Ok("1"))
}

pub(crate) fn run() -> Result<(), String> {
    let engines = engines()?;
    let mut table = Table::new();
    let mut problems = Vec::new();
    let mut opt_outs = Vec::new();
    for (engine, package) in &engines {
        let engine = engine.as_str();
        eprintln!("xtask: contract suite on {engine}");
        let output = Command::new(env!("CARGO"))
            .args([
                "test",
                "-p",
                package.as_str(),
                "--test",
                "contract",
                "--",
                "--show-output",
            ])
            .output()
            .map_err(|e| format!("could not run cargo: {e}"))?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        opt_outs.extend(
            stdout
                .lines()
                .filter(|l| l.starts_with("OPTED OUT: "))
                .map(|l| format!("{engine}: {l}")),
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        // The harness says SKIPPED once, on stderr, past the output capture.
        let skipped = stderr.contains("SKIPPED:") || stdout.contains("SKIPPED:");
        let mut cases = 0;
        for line in stdout.lines() {
            let Some(rest) = line.strip_prefix("test ") else {
                continue;
            };
            let Some((case, verdict)) = rest.split_once(" ... ") else {
                continue;
            };
            let opted_out = stdout.contains(&format!("OPTED OUT: {case}: "));
            let outcome = match verdict.trim() {
                "ok" if skipped => Outcome::Skipped,
                "ok" if opted_out => Outcome::OptedOut,
                "ok" => Outcome::Pass,
                v if v.starts_with("ignored") => continue,
                _ => Outcome::Fail,
            };
            cases += 1;
            table
                .entry(case.to_owned())
                .or_default()
                .insert(engine.to_owned(), outcome);
        }
        if !output.status.success() {
            // Show why: the failing cases' own output.
            if let Some(at) = stdout.find("\nfailures:\n") {
                eprintln!("xtask: {engine} failures:{}", &stdout[at..]);
            }
        }
        if cases == 0 {
            problems.push(format!(
                "{engine}: no case ran\n{}",
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        if skipped {
            let why = stderr
                .lines()
                .chain(stdout.lines())
                .find(|l| l.contains("SKIPPED:"))
                .unwrap_or_default();
            eprintln!("xtask: {engine} skipped: {why}");
            if required(engine) {
                problems.push(format!("{engine} was skipped but is required"));
            }
        }
        if !output.status.success() && !stdout.contains("FAILED") {
            problems.push(format!(
                "{engine}: {}",
                String::from_utf8_lossy(&output.stderr)
            ));
        }
    }
    print_table(&table, &engines);
    for line in &opt_outs {
        println!("{line}");
    }
    for (case, results) in &table {
        let failed: Vec<_> = results
            .iter()
            .filter(|(_, o)| **o == Outcome::Fail)
            .map(|(e, _)| e.as_str())
            .collect();
        if !failed.is_empty() {
            problems.push(format!("{case} fails on {}", failed.join(", ")));
        }
        if results.len() != engines.len() {
            problems.push(format!("{case} did not run on every engine"));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

fn print_table(table: &Table, engines: &[(String, String)]) {
    let width = table.keys().map(String::len).max().unwrap_or(4).max(4);
    print!("{:width$}", "case");
    for (engine, _) in engines {
        print!("  {engine:>8}");
    }
    println!();
    let mut totals = vec![0usize; engines.len()];
    for (case, results) in table {
        print!("{case:width$}");
        for (i, (engine, _)) in engines.iter().enumerate() {
            let cell = match results.get(engine) {
                Some(Outcome::Pass) => {
                    totals[i] += 1;
                    "pass"
                }
                Some(Outcome::Fail) => "FAIL",
                Some(Outcome::Skipped) => "skipped",
                Some(Outcome::OptedOut) => "opt-out",
                None => "-",
            };
            print!("  {cell:>8}");
        }
        println!();
    }
    print!("{:width$}", "passed");
    for total in totals {
        print!("  {:>8}", format!("{total}/{}", table.len()));
    }
    println!();
}
