//! `cargo xtask contract`: the contract suite on every engine, side by side.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use crate::{Outcome, Table};

/// One column of the table: an engine, or an engine behind middleware.
#[derive(Debug, Clone)]
pub(crate) struct Column {
    /// `sqlite`, `postgres`, `postgres+pgbouncer-tx`, …
    pub(crate) name: String,
    /// The package whose tests run it.
    pub(crate) package: String,
    /// That package's directory, under the workspace's root.
    pub(crate) dir: std::path::PathBuf,
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
                dir: dir.file_name().into(),
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

/// What one column's test binary printed, stdout and stderr together in
/// the order written, and whether it passed.
struct ColumnRun {
    output: String,
    passed: bool,
}

/// `cargo xtask contract`: each column's suite run on its own.
/// `cargo xtask contract --from FILE`: the columns read from a whole
/// `cargo test --workspace --all-features` run's output (stdout and stderr
/// together, as `2>&1 | tee FILE` keeps it), so that CI runs each suite
/// once.
pub(crate) fn run(args: &[String]) -> Result<(), String> {
    let engines = engines()?;
    let runs = match args {
        [] => engines
            .iter()
            .map(run_column)
            .collect::<Result<Vec<_>, _>>()?,
        [from, file] if from == "--from" => {
            let output = std::fs::read_to_string(file)
                .map_err(|e| format!("cannot read the test run's output {file}: {e}"))?;
            recorded_columns(&engines, &output)?
        }
        _ => return Err("usage: cargo xtask contract [--from FILE]".into()),
    };
    tabulate(&engines, &runs)
}

/// Runs one column's suite.
fn run_column(column: &Column) -> Result<ColumnRun, String> {
    eprintln!("xtask: contract suite on {}", column.name);
    let ran = Command::new(env!("CARGO"))
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
    // One binary: the order between its two streams does not matter.
    let output = format!(
        "{}{}",
        String::from_utf8_lossy(&ran.stdout),
        String::from_utf8_lossy(&ran.stderr)
    );
    Ok(ColumnRun {
        output,
        passed: ran.status.success(),
    })
}

/// Each column's part of a recorded `cargo test` run: from the line cargo
/// prints before running its test binary (`Running tests/contract.rs
/// (target/debug/deps/contract-…)`) to the next binary's. Which binary is
/// which column is cargo's to say (`--no-run --message-format=json`, with
/// the run's flags, builds nothing new).
fn recorded_columns(engines: &[Column], output: &str) -> Result<Vec<ColumnRun>, String> {
    let built = Command::new(env!("CARGO"))
        .args([
            "test",
            "--workspace",
            "--all-features",
            "--no-run",
            "--message-format=json",
        ])
        .output()
        .map_err(|e| format!("could not run cargo: {e}"))?;
    if !built.status.success() {
        return Err(format!(
            "cargo test --no-run failed:\n{}",
            String::from_utf8_lossy(&built.stderr)
        ));
    }
    let mut binaries: BTreeMap<std::path::PathBuf, String> = BTreeMap::new();
    for line in String::from_utf8_lossy(&built.stdout).lines() {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let (Some(source), Some(executable)) = (
            message["target"]["src_path"].as_str(),
            message["executable"].as_str(),
        ) else {
            continue;
        };
        if let Some(file) = std::path::Path::new(executable).file_name() {
            binaries.insert(source.into(), file.to_string_lossy().into_owned());
        }
    }
    let mut sections: BTreeMap<&str, String> = BTreeMap::new();
    let mut current: Option<&str> = None;
    for line in output.lines() {
        let trimmed = line.trim_start();
        if let Some(running) = trimmed.strip_prefix("Running ") {
            current = running
                .strip_suffix(')')
                .and_then(|r| r.rsplit(['/', '(']).next());
        } else if trimmed.starts_with("Doc-tests ") {
            current = None;
        }
        if let Some(binary) = current {
            let section = sections.entry(binary).or_default();
            section.push_str(line);
            section.push('\n');
        }
    }
    engines
        .iter()
        .map(|column| {
            let source = crate::workspace_root()
                .join(&column.dir)
                .join("tests")
                .join(format!("{}.rs", column.test));
            let binary = binaries
                .get(&source)
                .ok_or_else(|| format!("cargo names no test binary built from {}", source.display()))?;
            let output = sections.remove(binary.as_str()).ok_or_else(|| {
                format!(
                    "{}: the recorded run did not run {binary} (did it stop at an earlier failure?)",
                    column.name
                )
            })?;
            let passed = output.contains("test result: ok.") && !output.contains("test result: FAILED");
            Ok(ColumnRun { output, passed })
        })
        .collect()
}

/// The table of cases × columns, and what is wrong with it.
fn tabulate(engines: &[Column], runs: &[ColumnRun]) -> Result<(), String> {
    let mut table = Table::new();
    let mut problems = Vec::new();
    let mut opt_outs = Vec::new();
    for (column, run) in engines.iter().zip(runs) {
        let engine = column.name.as_str();
        let output = run.output.as_str();
        // Both said past the harness's output capture, once each.
        let skipped = output.contains("SKIPPED:");
        let opted: BTreeSet<&str> = output
            .lines()
            .filter_map(|l| l.strip_prefix("OPTED OUT: "))
            .collect();
        opt_outs.extend(opted.iter().map(|l| format!("{engine}: OPTED OUT: {l}")));
        let mut cases = 0;
        for line in output.lines() {
            let Some(rest) = line.strip_prefix("test ") else {
                continue;
            };
            let Some((case, verdict)) = rest.split_once(" ... ") else {
                continue;
            };
            let opted_out = opted.iter().any(|l| l.starts_with(&format!("{case}: ")));
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
        if !run.passed {
            // Show why: the failing cases' own output.
            match output.find("\nfailures:\n") {
                Some(at) => eprintln!("xtask: {engine} failures:{}", &output[at..]),
                None => problems.push(format!("{engine}: {output}")),
            }
        }
        if cases == 0 {
            problems.push(format!("{engine}: no case ran\n{output}"));
        }
        if skipped {
            let why = output
                .lines()
                .find(|l| l.contains("SKIPPED:"))
                .unwrap_or_default();
            eprintln!("xtask: {engine} skipped: {why}");
            if column_required(engine) {
                problems.push(format!("{engine} was skipped but is required"));
            }
        }
    }
    print_table(&table, engines);
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
