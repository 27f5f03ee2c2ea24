//! `cargo xtask contract`: the contract suite on every engine, side by side.

use std::process::Command;

use crate::{Outcome, Table};

/// One column of the table: an engine, or an engine behind middleware.
#[derive(Debug, Clone)]
pub(crate) struct Column {
    /// `sqlite`, `postgres`, `postgres+pgbouncer-tx`, …
    pub(crate) name: String,
    /// The package whose tests run it.
    pub(crate) package: String,
    /// Its test target: `contract`, `contract_pgbouncer_tx`, …
    pub(crate) test: String,
}

/// The columns of the table: every `alkstore-<engine>` package with a
/// `tests/contract.rs` (column `<engine>`), and each of its
/// `tests/contract_<middleware>.rs` (column `<engine>+<middleware>`, `_` as
/// `-`: the suite through that middleware), found on disk, so that a new
/// engine crate or deployment needs no line here.
pub(crate) fn engines() -> Result<Vec<Column>, String> {
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
        let Some(engine) = package.strip_prefix("alkstore-") else {
            continue;
        };
        let mut tests: Vec<String> = std::fs::read_dir(dir.path().join("tests"))
            .map_err(|e| format!("cannot list {}/tests: {e}", dir.path().display()))?
            .flatten()
            .filter_map(|e| {
                e.file_name()
                    .to_str()?
                    .strip_suffix(".rs")
                    .map(str::to_owned)
            })
            .filter(|t| t == "contract" || t.starts_with("contract_"))
            .collect();
        tests.sort();
        for test in tests {
            let name = match test.strip_prefix("contract_") {
                Some(middleware) => format!("{engine}+{}", middleware.replace('_', "-")),
                None => engine.to_owned(),
            };
            found.push(Column {
                name,
                package: package.to_owned(),
                test,
            });
        }
    }
    // The embedded default first, then the servers by name.
    found.sort_by_key(|c| (c.name != "sqlite", c.name.clone()));
    if found.is_empty() {
        return Err("no engine package with tests/contract.rs found".into());
    }
    Ok(found)
}

/// Whether a column must not be skipped: its engine or its middleware
/// (`postgres+pgbouncer-tx`: `postgres`, `pgbouncer`) is [`required`].
fn column_required(column: &str) -> bool {
    column
        .split('+')
        .any(|part| required(part.split('-').next().unwrap_or(part)))
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
    for column in &engines {
        let engine = column.name.as_str();
        eprintln!("xtask: contract suite on {engine}");
        let output = Command::new(env!("CARGO"))
            .args([
                "test",
                "-p",
                column.package.as_str(),
                "--test",
                column.test.as_str(),
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
            if column_required(engine) {
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

fn print_table(table: &Table, engines: &[Column]) {
    let width = table.keys().map(String::len).max().unwrap_or(4).max(4);
    let widths: Vec<usize> = engines.iter().map(|c| c.name.len().max(8)).collect();
    print!("{:width$}", "case");
    for (column, w) in engines.iter().zip(&widths) {
        print!("  {:>w$}", column.name);
    }
    println!();
    let mut totals = vec![0usize; engines.len()];
    for (case, results) in table {
        print!("{case:width$}");
        for (i, column) in engines.iter().enumerate() {
            let w = widths[i];
            let cell = match results.get(&column.name) {
                Some(Outcome::Pass) => {
                    totals[i] += 1;
                    "pass"
                }
                Some(Outcome::Fail) => "FAIL",
                Some(Outcome::Skipped) => "skipped",
                Some(Outcome::OptedOut) => "opt-out",
                None => "-",
            };
            print!("  {cell:>w$}");
        }
        println!();
    }
    print!("{:width$}", "passed");
    for (total, w) in totals.iter().zip(&widths) {
        print!("  {:>w$}", format!("{total}/{}", table.len()));
    }
    println!();
}
