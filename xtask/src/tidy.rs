//! `cargo xtask tidy`: what the compiler cannot check, checked on the tree
//! (as rust-analyzer's xtask does) — and run by `cargo test` too, as the
//! test `the_tree_is_tidy`, so a drift fails the README's test command.
//!
//! - every contract case (a `pub async fn` of `contract-suite/src/cases/`)
//!   is listed in `contract_tests!` — so no case exists without running —
//!   and named in `docs/contract.md`; every listed case exists;
//! - every "N contract cases" in the README, the CHANGELOG and `docs/`
//!   says the current N;
//! - every SQL statement an engine's doc quotes inline (`UPDATE …`,
//!   `DELETE …`, `SELECT …`, `INSERT …`, `CALL …`) is, up to whitespace and
//!   the placeholders for names, in that engine's `sql.rs`;
//! - every dependency a package declares is used by its code;
//! - every path a doc cites exists: a repository path in backticks, or a
//!   relative link (from the doc's own folder);
//! - every xtask command is in its usage line and its module doc;
//! - every page that shows Rust (a ```` ```rust ```` block) is compiled as a
//!   doctest: included by `alkstore/src/lib.rs`'s `documented_examples`;
//! - what the docs say is opted out is what the in-tree fixtures opt out
//!   of: a case named in a sentence saying so is one a fixture opts out of,
//!   and every such case is named in `docs/contract.md`;
//! - the engines a doc names are the engines there are: every
//!   `alkstore-<name>` is a package, "four engines" counts the engines
//!   (packages with an `ENGINE` descriptor), "both server engines" the
//!   sqlx ones, and each engine has its `docs/engine-<name>.md`, linked
//!   from the README.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

pub(crate) fn run() -> Result<(), String> {
    let (problems, cases) = problems(&crate::workspace_root())?;
    if problems.is_empty() {
        eprintln!(
            "xtask tidy: {cases} contract cases listed and documented; docs' SQL matches; \
             cited paths exist; xtask usage complete; no unused dependencies; every page \
             showing Rust is doctested; the engines named are the engines there are"
        );
        Ok(())
    } else {
        Err(format!("tidy found:\n- {}", problems.join("\n- ")))
    }
}

/// Every problem tidy finds in the tree at `root`, and how many contract
/// cases there are.
fn problems(root: &Path) -> Result<(Vec<String>, usize), String> {
    let mut problems = Vec::new();
    let cases = contract_cases(root, &mut problems)?;
    case_counts(root, cases.len(), &mut problems)?;
    docs_sql(root, &mut problems)?;
    unused_dependencies(root, &mut problems)?;
    cited_paths(root, &mut problems)?;
    xtask_usage(root, &mut problems)?;
    doctested_pages(root, &mut problems)?;
    engines_named(root, &mut problems)?;
    opt_outs_documented(root, &cases, &mut problems)?;
    Ok((problems, cases.len()))
}

/// The cases an in-tree fixture opts out of (`.opting_out(case!(NAME), …)`
/// in a test crate), by name.
fn opted_out(root: &Path) -> Result<BTreeSet<String>, String> {
    let mut cases = BTreeSet::new();
    for member in members(root)? {
        for file in rust_files(&root.join(&member).join("tests")) {
            let text = read(&file)?.replace(char::is_whitespace, "");
            for name in names_after(&text, ".opting_out(case!(") {
                cases.insert(name.to_owned());
            }
        }
    }
    // The suite's own test of opting out is no engine's.
    cases.remove("exclusion_two_owners");
    Ok(cases)
}

/// What the docs say is opted out is what the fixtures opt out of: every
/// contract case a doc names within a sentence that says "opted out",
/// "opts out" or "opt out" is one an in-tree fixture opts out of (a doc
/// still saying a case is opted out that the contract table runs is
/// drift), and every case a fixture opts out of is named in
/// docs/contract.md.
fn opt_outs_documented(
    root: &Path,
    cases: &BTreeSet<String>,
    problems: &mut Vec<String>,
) -> Result<(), String> {
    let opted = opted_out(root)?;
    let contract = read(&root.join("docs/contract.md"))?;
    for case in &opted {
        if !contract.contains(&format!("`{case}`")) {
            problems.push(format!(
                "a fixture opts out of `{case}`, which docs/contract.md does not name"
            ));
        }
    }
    let mut pages = markdown_files(root);
    pages.retain(|p| !p.ends_with("CHANGELOG.md"));
    for page in pages {
        let text = read(&page)?;
        // Sentences: a table's rows one by one, a paragraph's split at
        // its full stops.
        let sentences = text.split("\n\n").flat_map(|paragraph| {
            let parts: Vec<String> = match paragraph.trim_start().starts_with('|') {
                true => paragraph.lines().map(str::to_owned).collect(),
                false => paragraph
                    .replace('\n', " ")
                    .split(". ")
                    .map(str::to_owned)
                    .collect(),
            };
            parts
        });
        for sentence in sentences {
            let says_opted = ["opted out", "opts out", "opt out"]
                .iter()
                .any(|phrase| sentence.contains(phrase));
            if !says_opted {
                continue;
            }
            for case in cases {
                if sentence.contains(&format!("`{case}`")) && !opted.contains(case) {
                    problems.push(format!(
                        "{} says `{case}` is opted out of, which no in-tree fixture does",
                        page.strip_prefix(root).unwrap_or(&page).display()
                    ));
                }
            }
        }
    }
    Ok(())
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
        // The pages, not the plots beside them.
        files.extend(
            entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "md")),
        );
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
        .replace("{permits}", "permits")
        .replace("{acquire_permit_fn}", "acquire_permit")
        .replace("{acquire_permit_proc}", "acquire_permit")
        .replace("{acquire_rw_fn}", "acquire_rw")
        .replace("{acquire_rw_proc}", "acquire_rw")
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

/// The workspace's member folders.
fn members(root: &Path) -> Result<Vec<String>, String> {
    let manifest = read(&root.join("Cargo.toml"))?;
    Ok(manifest
        .lines()
        .skip_while(|l| !l.starts_with("members"))
        .skip(1)
        .take_while(|l| !l.starts_with(']'))
        .filter_map(|l| {
            l.trim()
                .trim_end_matches(',')
                .strip_prefix('"')?
                .strip_suffix('"')
                .map(str::to_owned)
        })
        .collect())
}

/// `[dependencies]` used by the package's own code; `[dev-dependencies]`
/// by any of its code.
fn unused_dependencies(root: &Path, problems: &mut Vec<String>) -> Result<(), String> {
    for member in members(root)? {
        let member = member.as_str();
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

/// The Markdown files whose citations are checked: the README, the
/// CHANGELOG, `docs/`, and each package's README.
fn markdown_files(root: &Path) -> Vec<PathBuf> {
    let mut files = vec![root.join("README.md"), root.join("CHANGELOG.md")];
    for dir in ["docs", "."] {
        let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if dir == "docs" && path.extension().is_some_and(|e| e == "md") {
                files.push(path);
            } else if dir == "." && path.is_dir() && path.join("Cargo.toml").is_file() {
                let readme = path.join("README.md");
                if readme.is_file() {
                    files.push(readme);
                }
            }
        }
    }
    files
}

/// Whether `text` reads as a path in the repository: path characters only,
/// at least one `/` between two names, a file's extension, a folder's
/// trailing `/` or two `/` (`crate/feature` is not a path), no scheme, not
/// absolute, not under `target/` (what builds write).
fn looks_like_a_path(text: &str) -> bool {
    !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_./-".contains(c))
        && text.trim_end_matches('/').contains('/')
        // A file, a folder (trailing `/`) or a deeper path: not `crate/feature`.
        && (text.ends_with('/')
            || text.matches('/').count() > 1
            || [".rs", ".md", ".toml", ".json", ".sh"]
                .iter()
                .any(|ext| text.ends_with(ext)))
        && !text.starts_with('/')
        && !text.starts_with("target/")
        && !text.contains("//")
}

/// A bare file name of the kinds the repository holds: no `/`, a name and
/// a `.rs` or `.md` extension.
fn is_a_file_name(text: &str) -> bool {
    !text.contains('/')
        && text.len() > 3
        && (text.ends_with(".rs") || text.ends_with(".md"))
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
}

/// The names of every file under `root`, `target/` and hidden folders left out.
fn file_names(root: &Path) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            if path.is_dir() {
                if name != "target" && !name.starts_with('.') {
                    dirs.push(path);
                }
            } else {
                names.insert(name);
            }
        }
    }
    names
}

/// Every repository path a doc cites in backticks, and every relative link,
/// exists. A backticked path counts only when its first part is a top-level
/// entry of the repository (so `user/repo`-like text is left alone).
fn cited_paths(root: &Path, problems: &mut Vec<String>) -> Result<(), String> {
    let names = file_names(root);
    for file in markdown_files(root) {
        let text = read(&file)?;
        let shown = file
            .strip_prefix(root)
            .unwrap_or(&file)
            .display()
            .to_string();
        let prose: String = text.split("```").step_by(2).collect::<Vec<_>>().join(" ");
        for (i, span) in prose.split('`').enumerate() {
            let top = span.split('/').next().unwrap_or("");
            let missing = if looks_like_a_path(span) && root.join(top).exists() {
                !root.join(span).exists()
            } else {
                // A bare file name (`lock.rs`, `contract.md`): some file of
                // the repository has it.
                is_a_file_name(span) && !names.contains(span)
            };
            if i % 2 == 1 && missing {
                problems.push(format!("{shown} cites `{span}`, which does not exist"));
            }
        }
        let dir = file.parent().unwrap_or(root);
        for (at, _) in prose.match_indices("](") {
            let target = &prose[at + 2..];
            let target = &target[..target.find(')').unwrap_or(target.len())];
            let path = target.split('#').next().unwrap_or("");
            if path.is_empty() || path.contains(':') || path.starts_with('/') {
                continue;
            }
            if !dir.join(path).exists() {
                problems.push(format!("{shown} links to {path}, which does not exist"));
            }
        }
    }
    Ok(())
}

/// Every command `xtask/src/main.rs` matches is in its usage line and in its
/// module doc (as `` `cargo xtask <command>` ``).
fn xtask_usage(root: &Path, problems: &mut Vec<String>) -> Result<(), String> {
    let main = read(&root.join("xtask/src/main.rs"))?;
    let commands: BTreeSet<&str> = main
        .match_indices("Some(\"")
        .filter_map(|(at, _)| {
            let rest = &main[at + 6..];
            let name = &rest[..rest.find('"')?];
            rest[name.len()..].starts_with("\") =>").then_some(name)
        })
        .collect();
    const USAGE: &str = "usage: cargo xtask <";
    let usage = main
        .find(USAGE)
        .map(|at| &main[at + USAGE.len()..])
        .and_then(|rest| rest.find('>').map(|end| &rest[..end]))
        .ok_or("xtask/src/main.rs has no usage line")?;
    let in_usage: BTreeSet<&str> = usage
        .split('|')
        .filter_map(|alt| alt.split_whitespace().next())
        .collect();
    let in_doc: BTreeSet<&str> = names_after(&main, "//! - `cargo xtask ")
        .into_iter()
        .collect();
    for command in &commands {
        if !in_usage.contains(command) {
            problems.push(format!("xtask's usage line leaves out `{command}`"));
        }
        if !in_doc.contains(command) {
            problems.push(format!(
                "xtask's module doc leaves out `cargo xtask {command}`"
            ));
        }
    }
    for listed in in_usage.union(&in_doc) {
        if !commands.contains(listed) {
            problems.push(format!("xtask names `{listed}`, which it does not run"));
        }
    }
    Ok(())
}

/// Every Markdown page with a ```` ```rust ```` block is included as a
/// doctest by `alkstore/src/lib.rs`.
fn doctested_pages(root: &Path, problems: &mut Vec<String>) -> Result<(), String> {
    let facade = read(&root.join("alkstore/src/lib.rs"))?;
    for page in markdown_files(root) {
        if !read(&page)?.contains("```rust") {
            continue;
        }
        let relative = page
            .strip_prefix(root)
            .unwrap_or(&page)
            .display()
            .to_string();
        if !facade.contains(&format!("include_str!(\"../../{relative}\")")) {
            problems.push(format!(
                "{relative} shows Rust but is not doctested (alkstore/src/lib.rs, documented_examples)"
            ));
        }
    }
    Ok(())
}

/// The engines there are, by name (each package whose `src/url.rs` holds
/// an `ENGINE` descriptor), and whether each runs on `alkstore-sqlx`.
fn engines(root: &Path) -> Result<Vec<(String, bool)>, String> {
    let mut engines = Vec::new();
    for member in members(root)? {
        let Ok(url) = std::fs::read_to_string(root.join(&member).join("src/url.rs")) else {
            continue;
        };
        let Some(at) = url.find("pub const ENGINE: EngineDescriptor") else {
            continue;
        };
        let name = names_after(&url[at..], "name: \"")
            .first()
            .map(|n| n.trim_end_matches('"').to_owned())
            .ok_or(format!("{member}/src/url.rs: an ENGINE without a name"))?;
        let sqlx = read(&root.join(&member).join("Cargo.toml"))?.contains("alkstore-sqlx");
        engines.push((name, sqlx));
    }
    Ok(engines)
}

/// The engines and packages the docs name are the ones there are.
fn engines_named(root: &Path, problems: &mut Vec<String>) -> Result<(), String> {
    let engines = engines(root)?;
    let sqlx = engines.iter().filter(|(_, sqlx)| *sqlx).count();
    let packages: BTreeSet<String> = members(root)?
        .iter()
        .filter_map(|m| {
            let manifest = std::fs::read_to_string(root.join(m).join("Cargo.toml")).ok()?;
            let name = manifest.lines().find_map(|l| l.strip_prefix("name = \""))?;
            Some(name.trim_end_matches('"').to_owned())
        })
        .collect();
    let number = |word: &str| {
        ["one", "two", "three", "four", "five", "six"]
            .iter()
            .position(|n| word.eq_ignore_ascii_case(n))
            .map(|i| i + 1)
    };
    let readme = read(&root.join("README.md"))?;
    for (engine, _) in &engines {
        let doc = format!("docs/engine-{engine}.md");
        if !root.join(&doc).is_file() {
            problems.push(format!("the engine {engine} has no {doc}"));
        } else if !readme.contains(&format!("({doc})")) {
            problems.push(format!("README.md does not link {doc}"));
        }
    }
    for page in markdown_files(root) {
        let text = read(&page)?;
        let relative = page
            .strip_prefix(root)
            .unwrap_or(&page)
            .display()
            .to_string();
        let words: Vec<&str> = text
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '<'))
            .filter(|w| !w.is_empty())
            .collect();
        for (i, word) in words.iter().enumerate() {
            let crate_name = word.trim_end_matches('-');
            if crate_name.starts_with("alkstore-")
                && !crate_name.contains('<')
                && !packages.contains(crate_name)
            {
                problems.push(format!(
                    "{relative} names `{crate_name}`, which is no package"
                ));
            }
            let next = |k: usize| words.get(i + k).map(|w| w.to_ascii_lowercase());
            let counted = match (next(1).as_deref(), next(2).as_deref()) {
                (Some("engines"), _) => number(word).map(|n| (n, engines.len(), "engines")),
                (Some("server" | "sqlx"), Some("engines")) => {
                    let n = if word.eq_ignore_ascii_case("both") {
                        Some(2)
                    } else {
                        number(word)
                    };
                    n.map(|n| (n, sqlx, "server engines"))
                }
                _ => None,
            };
            if let Some((said, are, what)) = counted {
                if said != are {
                    problems.push(format!("{relative} says {word} {what}; there are {are}"));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The README's test command runs tidy: a drift fails it.
    #[test]
    fn the_tree_is_tidy() {
        let (problems, cases) = problems(&crate::workspace_root()).unwrap();
        assert!(cases > 0);
        assert!(
            problems.is_empty(),
            "tidy found:\n- {}",
            problems.join("\n- ")
        );
    }

    /// A copy of the tracked tree, each drift planted in it, is found.
    #[test]
    fn planted_drifts_are_found() {
        let root = crate::workspace_root();
        let copy = std::env::temp_dir().join(format!("alkstore-tidy-{}", std::process::id()));
        let listed = std::process::Command::new("git")
            .args(["ls-files", "-z"])
            .current_dir(&root)
            .output()
            .expect("git runs");
        for path in listed.stdout.split(|b| *b == 0).filter(|p| !p.is_empty()) {
            let path = std::str::from_utf8(path).unwrap();
            let to = copy.join(path);
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(root.join(path), &to).unwrap();
        }
        let plant = |file: &str, from: &str, to: &str| {
            let path = copy.join(file);
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(text.contains(from), "{file} holds {from:?}");
            std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
        };
        let (clean, _) = problems(&copy).unwrap();
        assert!(clean.is_empty(), "the copy is tidy: {clean:?}");
        plant(
            "docs/failover.md",
            "## Runbook",
            "See `alkstore-core/src/nowhere.rs`.\n\n## Runbook",
        );
        plant(
            "docs/failover.md",
            "## Tests",
            "[gone](gone.md)\n\n## Tests",
        );
        plant(
            "docs/engine-postgres.md",
            "## ",
            "`DELETE FROM nowhere WHERE x = 1`\n\n## ",
        );
        plant("README.md", "# ", "# 7 contract cases\n\n# ");
        plant("docs/decisions.md", "# ", "`nowhere.rs`\n\n# ");
        plant(
            "xtask/src/main.rs",
            " | soak [minutes] | protos>",
            " | protos>",
        );
        plant(
            "docs/decisions.md",
            "Every engine (SQLite",
            "All five engines (SQLite",
        );
        plant("docs/reliability.md", "# ", "See `alkstore-redis`.\n\n# ");
        plant("docs/metrics.md", "# ", "```rust\nlet x = 1;\n```\n\n# ");
        let (found, _) = problems(&copy).unwrap();
        let _ = std::fs::remove_dir_all(&copy);
        for expected in [
            "docs/failover.md cites `alkstore-core/src/nowhere.rs`",
            "docs/failover.md links to gone.md",
            "quotes `DELETE FROM nowhere WHERE x = 1`",
            "README.md says 7 contract cases",
            "docs/decisions.md cites `nowhere.rs`",
            "xtask's usage line leaves out `soak`",
            "docs/decisions.md says five engines; there are 4",
            "docs/reliability.md names `alkstore-redis`, which is no package",
            "docs/metrics.md shows Rust but is not doctested",
        ] {
            assert!(
                found.iter().any(|p| p.contains(expected)),
                "{expected:?} not in {found:?}"
            );
        }
    }
}
