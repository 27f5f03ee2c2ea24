//! `cargo xtask tidy`: what the compiler cannot check, checked on the tree
//! (as rust-analyzer's xtask does).
//!
//! - every contract case (a `pub async fn` of `contract-suite/src/cases/`)
//!   is listed in `contract_tests!` — so no case exists without running —
//!   and named in `docs/contract.md`; every listed case exists;
//! - every "N contract cases" in the README, the CHANGELOG and `docs/`
//!   says the current N;
//! - every SQL statement an engine's doc quotes inline (`UPDATE …`,
//!   `DELETE …`, `SELECT …`, `INSERT …`, `CALL …`) is, up to whitespace and
//!   the placeholders for names, in that engine's `sql.rs`;
//! - every dependency a package declares is used by its code.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

pub(crate) fn run() -> Result<(), String> {
    let root = crate::workspace_root();
    let mut problems = Vec::new();
    let cases = contract_cases(&root, &mut problems)?;
    case_counts(&root, cases.len(), &mut problems)?;
    docs_sql(&root, &mut problems)?;
    unused_dependencies(&root, &mut problems)?;
    if problems.is_empty() {
        eprintln!(
            "xtask tidy: {} contract cases listed and documented; docs' SQL matches; no unused dependencies",
            cases.len()
        );
        Ok(())
    } else {
        Err(format!("tidy found:\n- {}", problems.join("\n- ")))
    }
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

/// `.rs` files under `dir`, recursively.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return files;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

/// Identifier-like words following `prefix` in `text`.
fn names_after<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
    text.match_indices(prefix)
        .map(|(at, _)| {
            let rest = &text[at + prefix.len()..];
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .collect()
}

/// The cases: defined, listed in `contract_tests!`, documented.
fn contract_cases(root: &Path, problems: &mut Vec<String>) -> Result<BTreeSet<String>, String> {
    let mut defined = BTreeSet::new();
    for file in rust_files(&root.join("contract-suite/src/cases")) {
        for name in names_after(&read(&file)?, "\npub async fn ") {
            defined.insert(name.to_owned());
        }
    }
    let lib = read(&root.join("contract-suite/src/lib.rs"))?;
    const LIST: &str = "$callback!($($extra)*;";
    let start = lib.find(LIST).ok_or("__with_cases! has no case list")?;
    let end = lib[start..]
        .find(");")
        .map(|e| start + e)
        .ok_or("__with_cases!'s case list does not end")?;
    let listed: BTreeSet<String> = lib[start + LIST.len()..end]
        .split([',', ';', ':', '\n', ' '])
        .map(str::trim)
        .filter(|w| !w.is_empty() && *w != "peers")
        .map(str::to_owned)
        .collect();
    for case in defined.difference(&listed) {
        problems.push(format!(
            "contract case `{case}` is not listed in __with_cases! (contract-suite/src/lib.rs)"
        ));
    }
    for case in listed.difference(&defined) {
        problems.push(format!(
            "__with_cases! lists `{case}`, which no cases module defines"
        ));
    }
    let doc = read(&root.join("docs/contract.md"))?;
    for case in &defined {
        if !doc.contains(&format!("`{case}`")) {
            problems.push(format!(
                "contract case `{case}` is not named in docs/contract.md"
            ));
        }
    }
    Ok(defined)
}

/// Every "N contract cases" in the docs says the current count.
fn case_counts(root: &Path, count: usize, problems: &mut Vec<String>) -> Result<(), String> {
    let mut files = vec![root.join("README.md"), root.join("CHANGELOG.md")];
    if let Ok(entries) = std::fs::read_dir(root.join("docs")) {
        files.extend(entries.flatten().map(|e| e.path()));
    }
    for file in files {
        let text = read(&file)?.replace('\n', " ");
        for (at, _) in text.match_indices(" contract cases") {
            let digits: String = text[..at]
                .chars()
                .rev()
                .take_while(char::is_ascii_digit)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            if let Ok(n) = digits.parse::<usize>() {
                if n != count {
                    problems.push(format!(
                        "{} says {n} contract cases; there are {count}",
                        file.strip_prefix(root).unwrap_or(&file).display()
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Whitespace collapsed; names spelled as the docs spell them.
fn normalized(sql: &str) -> String {
    let replaced = sql
        .replace("{NOW_MS}", "now_ms")
        .replace("{locks}", "locks")
        .replace("{meta}", "meta")
        .replace("{fences}", "fences")
        .replace("{acquire_proc}", "acquire")
        .replace("{acquire_fn}", "acquire");
    replaced.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Inline SQL in `docs/engine-<engine>.md` is in `alkstore-<engine>/src/sql.rs`.
fn docs_sql(root: &Path, problems: &mut Vec<String>) -> Result<(), String> {
    for engine in ["postgres", "mysql"] {
        let doc_path = root.join(format!("docs/engine-{engine}.md"));
        let doc = read(&doc_path)?;
        let sql = normalized(&read(&root.join(format!("alkstore-{engine}/src/sql.rs")))?);
        let mut checked = 0;
        // Inline code spans: between single backticks, outside fenced
        // blocks and outside double-backtick spans (which may hold a `).
        let mut prose: String = doc.split("```").step_by(2).collect::<Vec<_>>().join(" ");
        while let Some(open) = prose.find("``") {
            let close = prose[open + 2..]
                .find("``")
                .map_or(prose.len(), |c| open + 2 + c + 2);
            prose.replace_range(open..close, " ");
        }
        for (i, span) in prose.split('`').enumerate() {
            let statement = normalized(span);
            let is_statement = i % 2 == 1
                && ["UPDATE ", "DELETE ", "SELECT ", "INSERT ", "CALL "]
                    .iter()
                    .any(|k| statement.starts_with(k))
                && !statement.contains('…');
            if !is_statement {
                continue;
            }
            checked += 1;
            if !sql.contains(&statement) {
                problems.push(format!(
                    "docs/engine-{engine}.md quotes `{statement}`, which alkstore-{engine}/src/sql.rs does not hold"
                ));
            }
        }
        if checked == 0 {
            problems.push(format!(
                "docs/engine-{engine}.md quotes no statement to check"
            ));
        }
    }
    Ok(())
}

/// `[dependencies]` used by the package's own code; `[dev-dependencies]`
/// by any of its code.
fn unused_dependencies(root: &Path, problems: &mut Vec<String>) -> Result<(), String> {
    let manifest = read(&root.join("Cargo.toml"))?;
    let members: Vec<&str> = manifest
        .lines()
        .skip_while(|l| !l.starts_with("members"))
        .skip(1)
        .take_while(|l| !l.starts_with(']'))
        .filter_map(|l| {
            l.trim()
                .trim_end_matches(',')
                .strip_prefix('"')?
                .strip_suffix('"')
        })
        .collect();
    for member in members {
        let dir = root.join(member);
        let package = read(&dir.join("Cargo.toml"))?;
        let src: String = rust_files(&dir.join("src"))
            .iter()
            .map(|f| read(f).unwrap_or_default())
            .collect();
        let all: String = src.clone()
            + &["tests", "examples", "benches"]
                .iter()
                .flat_map(|d| rust_files(&dir.join(d)))
                .map(|f| read(&f).unwrap_or_default())
                .collect::<String>();
        let mut section = "";
        for line in package.lines() {
            if line.starts_with('[') {
                section = line.trim();
                continue;
            }
            let Some(name) = line.split(['=', '.']).next().map(str::trim) else {
                continue;
            };
            if name.is_empty() || name.starts_with('#') {
                continue;
            }
            let code = match section {
                "[dependencies]" => &src,
                "[dev-dependencies]" => &all,
                _ => continue,
            };
            let ident = name.replace('-', "_");
            if !code.contains(&format!("{ident}::"))
                && !code.contains(&format!("{ident}!"))
                && !code.contains(&format!("use {ident}"))
                && !code.contains(&format!("{ident} as"))
                && !code.contains(&format!("#[{ident}"))
            {
                problems.push(format!("{member}: {section} `{name}` is not used"));
            }
        }
    }
    Ok(())
}
