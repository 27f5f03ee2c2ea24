//! One async function per command, over the `dyn Store` the URL opens.
//!
//! Each answers an [`Outcome`] (exit 0, 1 or 4) or an error (exit 3);
//! [`run`] closes the store whatever the command answered.

use std::io::{self, BufRead, Write};
use std::time::{Duration, SystemTime};

use alkstore::doctor::Verdict;
use alkstore::{BoxError, Store};
use alkstore::{Listed, MAX_LIST_LIMIT};

use crate::cli::{Command, StoreCommand};
use crate::output::{self, Row, printable};

/// How a command ended, when it did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// It did what was asked: exit 0.
    Done,
    /// Nothing was there (`show` or `release` of a free name): exit 1.
    Nothing,
    /// The operator answered no at the confirmation prompt: exit 4.
    Aborted,
    /// `doctor`: a promise is given up, or a setting could not be read: exit 5.
    Unkept,
}

impl Outcome {
    /// The process exit code of this outcome.
    pub fn code(self) -> u8 {
        match self {
            Outcome::Done => 0,
            Outcome::Nothing => 1,
            Outcome::Aborted => 4,
            Outcome::Unkept => 5,
        }
    }
}

/// Runs `command`: `doctor` on the deployment `url` names, any other on the
/// store it names — opened, and closed after (also when the command failed;
/// the command's error wins over a failed close).
pub async fn run(url: &str, command: Command) -> Result<Outcome, BoxError> {
    let command = match command {
        Command::Doctor { json } => return doctor(url, json).await,
        Command::Store(command) => command,
    };
    let store = alkstore::open(url).await?;
    // `watch` checks for itself, at its start and at each change.
    if matches!(
        command,
        StoreCommand::List { .. } | StoreCommand::Show { .. }
    ) {
        warn_if_standby(url).await;
    }
    let result = dispatch(&*store, command, url).await;
    let closed = store.close().await;
    let outcome = result?;
    closed?;
    Ok(outcome)
}

/// Whether the server `url` names is a standby (false when it cannot be
/// inspected).
async fn is_standby(url: &str) -> bool {
    alkstore::is_standby(url).await.unwrap_or(false)
}

/// Says on stderr, when the server `url` names is a standby, that what it
/// shows may be behind the primary's; true when it said so. Silent when
/// the server cannot be inspected (the command itself reports that).
async fn warn_if_standby(url: &str) -> bool {
    let standby = is_standby(url).await;
    if standby {
        eprintln!(
            "warning: the server is a standby (read-only, in recovery): what it shows may be \
             behind the primary, and a switchover or failover may be under way; point the URL \
             at the primary"
        );
    }
    standby
}

/// Runs one command on an open store (`url` names it, for `watch`'s
/// standby check).
async fn dispatch(
    store: &dyn Store,
    command: StoreCommand,
    url: &str,
) -> Result<Outcome, BoxError> {
    match command {
        StoreCommand::List {
            prefix,
            limit,
            json,
        } => list(store, &prefix, limit.map(|n| n.get()), json).await,
        StoreCommand::Show { name, json } => show(store, &name, json).await,
        StoreCommand::Release {
            force,
            yes,
            fence,
            name,
        } => release(store, &name, fence, force, yes).await,
        StoreCommand::Purge { json } => purge(store, json).await,
        StoreCommand::RaiseFences { by, json } => raise_fences(store, by, json).await,
        StoreCommand::Watch { name, interval } => {
            watch(store, &name, Duration::from_millis(interval), url).await
        }
    }
}

/// `list`: every live holder whose name starts with `prefix` (at most `cap`
/// of them), paging through [`Store::list`] with pages of
/// [`MAX_LIST_LIMIT`] until a short page; a table, or a JSON array.
pub async fn list(
    store: &dyn Store,
    prefix: &str,
    cap: Option<usize>,
    json: bool,
) -> Result<Outcome, BoxError> {
    let mut found: Vec<Listed> = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let want = cap.map_or(MAX_LIST_LIMIT, |cap| {
            cap.saturating_sub(found.len()).min(MAX_LIST_LIMIT)
        });
        if want == 0 {
            break;
        }
        let page = store.list(prefix, after.as_deref(), want).await?;
        let last_page = page.len() < want;
        if let Some(last) = page.last() {
            after = Some(last.name.clone());
        }
        found.extend(page);
        if last_page {
            break;
        }
    }
    if let Some(cap) = cap {
        found.truncate(cap);
    }

    let mut out = io::stdout().lock();
    if json {
        let entries = found.iter().map(output::entry_json).collect();
        output::write_json(&mut out, &serde_json::Value::Array(entries))?;
    } else if found.is_empty() {
        if prefix.is_empty() {
            writeln!(out, "no live locks")?;
        } else {
            writeln!(out, "no live locks with names starting with {prefix:?}")?;
        }
    } else {
        let rows: Vec<Row<'_>> = found.iter().collect();
        output::table(&mut out, &rows)?;
    }
    out.flush()?;
    Ok(Outcome::Done)
}

/// `show`: the live grants of `name` — a lock's holder, or each live permit
/// of a semaphore — as a table, then its queue's waiters, first in line
/// first; in JSON an object for a lock and an array for a semaphore (no
/// waiters: the shape scripts read stays). A free name says so (`null` in
/// JSON) and is [`Outcome::Nothing`].
pub async fn show(store: &dyn Store, name: &str, json: bool) -> Result<Outcome, BoxError> {
    let grants = store.holders(name).await?;
    // The queue is the second part of the answer: when it cannot be read
    // (a role without rights on it), the grants are still shown.
    let waiters = match json {
        true => Vec::new(),
        false => store.waiters(name).await.unwrap_or_else(|error| {
            note(&format!(
                "the queue of {} could not be read: {error}",
                printable(name)
            ));
            Vec::new()
        }),
    };
    let mut out = io::stdout().lock();
    match (grants.as_slice(), json) {
        ([], true) => output::write_json(&mut out, &serde_json::Value::Null)?,
        ([], false) => writeln!(out, "{} is free", printable(name))?,
        ([lock], true) if output::is_lock(lock) => {
            output::write_json(&mut out, &output::entry_json(lock))?
        }
        (permits, true) => {
            let entries = permits.iter().map(output::entry_json).collect();
            output::write_json(&mut out, &serde_json::Value::Array(entries))?
        }
        (grants, false) => output::table(&mut out, &grants.iter().collect::<Vec<_>>())?,
    }
    if !waiters.is_empty() {
        writeln!(
            out,
            "\n{} waiting, first come, first served:",
            waiters.len()
        )?;
        output::waiters_table(&mut out, &waiters)?;
    }
    out.flush()?;
    Ok(if grants.is_empty() {
        Outcome::Nothing
    } else {
        Outcome::Done
    })
}

/// `release --force`: removes the live grant of `name` — with `fence`, the
/// live grant of that fence (one permit of a semaphore; a semaphore's name
/// needs it). Unless `yes`, first shows the grant and asks on stderr;
/// anything but `y`/`yes` on stdin is [`Outcome::Aborted`]. The answer
/// removes exactly the grant shown ([`Store::force_release_grant`]): if
/// another grant holds the name by then, nothing is removed and that is
/// [`Outcome::Aborted`] too. With `yes` and no `fence`, whatever grant holds
/// the lock is removed ([`Store::force_release`]). A free name, or no live
/// grant of `fence`, is [`Outcome::Nothing`] (and nothing is asked).
pub async fn release(
    store: &dyn Store,
    name: &str,
    fence: Option<u64>,
    force: bool,
    yes: bool,
) -> Result<Outcome, BoxError> {
    if !force {
        // clap requires --force; this keeps the rule where it is enforced too.
        return Err("release takes the lock away from its holder: say so with --force".into());
    }
    let confirmed = if yes {
        None
    } else {
        let grants = store.holders(name).await?;
        let chosen = match fence {
            Some(fence) => grants.iter().find(|g| g.holder.fence == fence),
            None => match grants.as_slice() {
                [] => None,
                [lock] if output::is_lock(lock) => Some(lock),
                grants => return Err(grants_need_a_fence(name, grants).into()),
            },
        };
        let Some(chosen) = chosen else {
            say_not_held(name, fence)?;
            return Ok(Outcome::Nothing);
        };
        let question = format!(
            "Release {} held by {}? [y/N] ",
            printable(name),
            output::describe_grant(chosen)
        );
        if !confirm(question).await? {
            note(&format!("aborted; {} is still held", printable(name)));
            return Ok(Outcome::Aborted);
        }
        Some(chosen.clone())
    };
    // What was confirmed is what is removed: a grant that replaced it
    // after the question (the lease lapsed, another holder came) stays.
    let released = match (&confirmed, fence) {
        (Some(confirmed), _) => {
            store
                .force_release_grant(name, confirmed.holder.fence)
                .await?
        }
        (None, Some(fence)) => store.force_release_grant(name, fence).await?,
        (None, None) => store.force_release(name).await?,
    };
    let Some(released) = released else {
        match (&confirmed, store.holders(name).await?.first()) {
            (Some(confirmed), Some(now)) if output::is_lock(confirmed) => {
                note(&format!(
                    "the holder changed after the question: {} is now held by {}; nothing \
                     released (it was {})",
                    printable(name),
                    output::describe_grant(now),
                    output::describe_grant(confirmed)
                ));
                return Ok(Outcome::Aborted);
            }
            (Some(confirmed), _) if !output::is_lock(confirmed) => {
                note(&format!(
                    "the grant {} ended after the question; nothing released",
                    output::describe_grant(confirmed)
                ));
                return Ok(Outcome::Aborted);
            }
            _ => {
                say_not_held(name, fence)?;
                return Ok(Outcome::Nothing);
            }
        }
    };
    let mut out = io::stdout().lock();
    writeln!(
        out,
        "released {} held by {}",
        printable(name),
        output::describe(&released)
    )?;
    out.flush()?;
    Ok(Outcome::Done)
}

/// `raise-fences`: raises the fences by `by` and prints the lowest fence a
/// later grant can get.
pub async fn raise_fences(store: &dyn Store, by: u64, json: bool) -> Result<Outcome, BoxError> {
    let next = store.raise_fences(by).await?;
    let mut out = io::stdout().lock();
    if json {
        output::write_json(
            &mut out,
            &serde_json::json!({ "raised_by": by, "next_fence_at_least": next }),
        )?;
    } else {
        writeln!(
            out,
            "fences raised by {by}: every later grant's fence is at least {next}"
        )?;
    }
    out.flush()?;
    Ok(Outcome::Done)
}

/// `purge`: deletes every expired lock row and prints how many.
pub async fn purge(store: &dyn Store, json: bool) -> Result<Outcome, BoxError> {
    let purged = store.purge_expired().await?;
    let mut out = io::stdout().lock();
    if json {
        output::write_json(&mut out, &serde_json::json!({ "purged": purged }))?;
    } else {
        let plural = if purged == 1 { "" } else { "s" };
        writeln!(out, "purged {purged} expired lock{plural}")?;
    }
    out.flush()?;
    Ok(Outcome::Done)
}

/// `watch`: asks for the grants of `name` every `interval` and prints a
/// line (flushed) each time they change — another owner or fence, or free —
/// the first answer included; at each change it checks again whether the
/// server `url` names is a standby, and warns (once per stretch) when it is.
/// Runs until Ctrl-C, then ends [`Outcome::Done`].
pub async fn watch(
    store: &dyn Store,
    name: &str,
    interval: Duration,
    url: &str,
) -> Result<Outcome, BoxError> {
    let mut warned = warn_if_standby(url).await;
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    // `biased`: Ctrl-C is polled first, so its handler is in place before
    // the first line tells anyone that the watch has started.
    let mut last: Option<Vec<(String, u64)>> = None;
    loop {
        let grants = tokio::select! {
            biased;
            stop = &mut ctrl_c => {
                stop?;
                break;
            }
            grants = store.holders(name) => grants?,
        };
        let now: Vec<(String, u64)> = grants
            .iter()
            .map(|g| (g.holder.owner.clone(), g.holder.fence))
            .collect();
        if last.as_ref() != Some(&now) {
            if last.is_some() {
                warned = match warned {
                    true => is_standby(url).await,
                    false => warn_if_standby(url).await,
                };
            }
            output::watch_line(&mut io::stdout().lock(), SystemTime::now(), &grants)?;
            last = Some(now);
        }
        tokio::select! {
            biased;
            stop = &mut ctrl_c => {
                stop?;
                break;
            }
            () = tokio::time::sleep(interval) => {}
        }
    }
    Ok(Outcome::Done)
}

/// Says on stdout that `name` (or its grant of `fence`) is not held and
/// nothing was released.
fn say_not_held(name: &str, fence: Option<u64>) -> io::Result<()> {
    let mut out = io::stdout().lock();
    match fence {
        None => writeln!(out, "{} is free; nothing released", printable(name))?,
        Some(fence) => writeln!(
            out,
            "no live grant of {} has fence {fence}; nothing released",
            printable(name)
        )?,
    }
    out.flush()
}

/// The refusal of `release --force NAME` without `--fence` when a
/// semaphore's permits or a reader-writer lock's grants hold the name:
/// which ones, and how to pick one.
fn grants_need_a_fence(name: &str, grants: &[Listed]) -> String {
    let held: Vec<String> = grants.iter().map(output::describe_grant).collect();
    let kind = if grants.iter().any(|g| g.access.is_some()) {
        "a reader-writer lock's: live grants:"
    } else {
        "a semaphore's: live permits:"
    };
    format!(
        "{} is {kind} {} ({}); release one with --fence F",
        printable(name),
        grants.len(),
        held.join(", ")
    )
}

/// A notice on stderr (nothing in it comes from the URL).
fn note(text: &str) {
    let _ = writeln!(io::stderr().lock(), "alkstore: {text}");
}

/// Asks `question` on stderr and reads one line from stdin (off the
/// runtime's thread): true for `y` or `yes`, in any case; false for
/// anything else, end of input included.
async fn confirm(question: String) -> Result<bool, BoxError> {
    let line = tokio::task::spawn_blocking(move || -> io::Result<String> {
        {
            let mut err = io::stderr().lock();
            err.write_all(question.as_bytes())?;
            err.flush()?;
        }
        let mut line = String::new();
        io::stdin().lock().read_line(&mut line)?;
        if !line.ends_with('\n') {
            // End of input: end the question's line.
            let _ = writeln!(io::stderr().lock());
        }
        Ok(line)
    })
    .await??;
    let answer = line.trim().to_ascii_lowercase();
    Ok(answer == "y" || answer == "yes")
}

/// `doctor`: the deployment's settings and each promise's verdict, as a
/// table or JSON; [`Outcome::Unkept`] unless every promise is kept or does
/// not apply and nothing is to be warned of.
pub async fn doctor(url: &str, json: bool) -> Result<Outcome, BoxError> {
    let report = alkstore::inspect(url).await?;
    let mut out = io::stdout().lock();
    if json {
        output::write_json(&mut out, &output::report_json(&report))?;
    } else {
        output::report(&mut out, &report)?;
    }
    Ok(match report.worst() {
        _ if !report.warnings.is_empty() => Outcome::Unkept,
        Verdict::NotApplicable | Verdict::Kept => Outcome::Done,
        Verdict::Unknown | Verdict::GivenUp => Outcome::Unkept,
    })
}
