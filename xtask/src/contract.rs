//! `cargo xtask contract`: the contract suite on every engine, side by side.

use std::process::Command;

use crate::{Outcome, Table};

/// The engines and the test target that runs the suite on each.
const ENGINES: &[(&str, &str)] = &[
    ("sqlite", "alkstore-sqlite"),
    ("postgres", "alkstore-postgres"),
];

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
    let mut table = Table::new();
    let mut problems = Vec::new();
    for &(engine, package) in ENGINES {
        eprintln!("xtask: contract suite on {engine}");
        let output = Command::new(env!("CARGO"))
            .args([
                "test",
                "-p",
                package,
                "--test",
                "contract",
                "--",
                "--show-output",
            ])
            .output()
            .map_err(|e| format!("could not run cargo: {e}"))?;
        let stdout = String::from_utf8_lossy(&output.stdout);
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
            let outcome = match verdict.trim() {
                "ok" if skipped => Outcome::Skipped,
                "ok" => Outcome::Pass,
                v if v.starts_with("ignored") => continue,
                _ => Outcome::Fail,
            };
            cases += 1;
            table
                .entry(case.to_owned())
                .or_default()
                .insert(engine, outcome);
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
    print_table(&table);
    for (case, results) in &table {
        let failed: Vec<_> = results
            .iter()
            .filter(|(_, o)| **o == Outcome::Fail)
            .map(|(e, _)| *e)
            .collect();
        if !failed.is_empty() {
            problems.push(format!("{case} fails on {}", failed.join(", ")));
        }
        if results.len() != ENGINES.len() {
            problems.push(format!("{case} did not run on every engine"));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

fn print_table(table: &Table) {
    let width = table.keys().map(String::len).max().unwrap_or(4).max(4);
    print!("{:width$}", "case");
    for (engine, _) in ENGINES {
        print!("  {engine:>8}");
    }
    println!();
    let mut totals = vec![0usize; ENGINES.len()];
    for (case, results) in table {
        print!("{case:width$}");
        for (i, (engine, _)) in ENGINES.iter().enumerate() {
            let cell = match results.get(engine) {
                Some(Outcome::Pass) => {
                    totals[i] += 1;
                    "pass"
                }
                Some(Outcome::Fail) => "FAIL",
                Some(Outcome::Skipped) => "skipped",
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
