//! What the commands print: human tables (aligned by hand), JSON values,
//! lease durations such as `29.8s`, and UTC timestamps.

use std::io::{self, Write};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use alkstore::doctor::Report;
use alkstore::{Access, Holder, Listed, Waiter};
use serde_json::{Value, json};

/// The table's column headers.
const HEADERS: [&str; 5] = ["NAME", "GRANT", "OWNER", "FENCE", "EXPIRES IN"];

/// One row of a table: a live grant, a lock's, a semaphore's permit, or a
/// reader-writer lock's reader or writer.
pub type Row<'a> = &'a Listed;

/// True for a plain lock's grant (not a permit, not a reader or writer).
pub fn is_lock(listed: &Listed) -> bool {
    listed.permit.is_none() && listed.access.is_none()
}

/// What a grant is, as the table shows it: a permit `1 of 3`, `read` or
/// `write`; a lock's grant: `-`.
fn grant_cell(listed: &Listed) -> String {
    match (listed.permit, listed.access) {
        (Some(p), _) => format!("{} of {}", p.slot, p.permits),
        (None, Some(access)) => access.to_string(),
        (None, None) => "-".to_owned(),
    }
}

/// Writes `rows` as a table under the headers NAME, GRANT, OWNER, FENCE
/// and EXPIRES IN: text columns aligned left, numbers right, two spaces
/// apart.
pub fn table(out: &mut impl Write, rows: &[Row<'_>]) -> io::Result<()> {
    let cells: Vec<[String; 5]> = rows
        .iter()
        .map(|row| {
            [
                printable(&row.name),
                grant_cell(row),
                printable(&row.holder.owner),
                row.holder.fence.to_string(),
                duration(row.holder.expires_in),
            ]
        })
        .collect();
    aligned(out, HEADERS, &cells, [false, false, false, true, true])
}

/// The waiters table's column headers.
const WAITER_HEADERS: [&str; 5] = ["PLACE", "OWNER", "WAITS FOR", "WAITING", "PLACE LASTS"];

/// Writes a name's waiters, first in line first, under the headers PLACE
/// (1 is next), OWNER, WAITS FOR (lock, permit, read, write), WAITING (how
/// long it has waited) and PLACE LASTS (how long its place lasts unless
/// its next attempt renews it).
pub fn waiters_table(out: &mut impl Write, waiters: &[Waiter]) -> io::Result<()> {
    let cells: Vec<[String; 5]> = waiters
        .iter()
        .enumerate()
        .map(|(place, waiter)| {
            [
                (place + 1).to_string(),
                printable(&waiter.owner),
                waiter.kind.to_owned(),
                duration(waiter.waited),
                duration(waiter.expires_in),
            ]
        })
        .collect();
    aligned(
        out,
        WAITER_HEADERS,
        &cells,
        [true, false, false, true, true],
    )
}

/// `rows` under `headers`, each column as wide as its widest cell, two
/// spaces apart: aligned right where `right` says, left otherwise (no
/// trailing spaces when the last column is right-aligned).
fn aligned<const N: usize>(
    out: &mut impl Write,
    headers: [&str; N],
    rows: &[[String; N]],
    right: [bool; N],
) -> io::Result<()> {
    let mut widths = headers.map(|header| header.chars().count());
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |out: &mut dyn Write, cells: [&str; N]| -> io::Result<()> {
        let mut text = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i > 0 {
                text.push_str("  ");
            }
            let pad = " ".repeat(widths[i].saturating_sub(cell.chars().count()));
            match right[i] {
                true => text.extend([pad.as_str(), cell]),
                false => text.extend([*cell, pad.as_str()]),
            }
        }
        writeln!(out, "{}", text.trim_end())
    };
    line(out, headers)?;
    for row in rows {
        line(out, row.each_ref().map(String::as_str))?;
    }
    Ok(())
}

/// Writes a `doctor` report: where, one line per promise (promise,
/// verdict, why), then the settings read.
pub fn report(out: &mut impl Write, report: &Report) -> io::Result<()> {
    writeln!(out, "{} at {}", report.engine, printable(&report.server))?;
    writeln!(out)?;
    let width = report
        .findings
        .iter()
        .map(|f| f.promise.describe().len())
        .chain(["PROMISE".len()])
        .max()
        .unwrap_or(0);
    let verdict_width = "given up".len();
    writeln!(
        out,
        "{:<width$}  {:<verdict_width$}  WHY",
        "PROMISE", "VERDICT"
    )?;
    for finding in &report.findings {
        writeln!(
            out,
            "{:<width$}  {:<verdict_width$}  {}",
            finding.promise.describe(),
            finding.verdict.key(),
            printable(&finding.because)
        )?;
    }
    if !report.warnings.is_empty() {
        writeln!(out)?;
        for warning in &report.warnings {
            writeln!(out, "WARNING: {}", printable(warning))?;
        }
    }
    if !report.settings.is_empty() {
        writeln!(out)?;
        writeln!(out, "SETTINGS")?;
        for (name, value) in &report.settings {
            writeln!(out, "{} = {}", printable(name), printable(value))?;
        }
    }
    Ok(())
}

/// The JSON object of a `doctor` report: `{"engine", "server", "settings":
/// {name: value}, "promises": [{"promise", "verdict", "because"}], "worst",
/// "warnings": [sentence], "standby"}`.
pub fn report_json(report: &Report) -> Value {
    let settings: serde_json::Map<String, Value> = report
        .settings
        .iter()
        .map(|(name, value)| (name.clone(), Value::from(value.as_str())))
        .collect();
    let promises: Vec<Value> = report
        .findings
        .iter()
        .map(|f| {
            json!({
                "promise": f.promise.key(),
                "verdict": f.verdict.key(),
                "because": f.because,
            })
        })
        .collect();
    json!({
        "engine": report.engine,
        "server": report.server,
        "settings": settings,
        "promises": promises,
        "worst": report.worst().key(),
        "warnings": report.warnings,
        "standby": report.standby,
    })
}

/// The JSON object of one live grant: `{"name", "owner", "fence",
/// "expires_in_ms", "slot", "permits", "access"}`: `slot` a permit's or a
/// reader's, `permits` a permit's, `access` `"read"` or `"write"` for a
/// reader-writer lock's grant (`null` where they do not apply).
pub fn entry_json(listed: &Listed) -> Value {
    let holder = &listed.holder;
    json!({
        "name": listed.name,
        "owner": holder.owner,
        "fence": holder.fence,
        "expires_in_ms": millis(holder.expires_in),
        "slot": match (listed.permit, listed.access) {
            (Some(p), _) => Some(p.slot),
            (None, Some(Access::Read { slot })) => Some(slot),
            _ => None,
        },
        "permits": listed.permit.map(|p| p.permits),
        "access": listed.access.map(|a| a.to_string()),
    })
}

/// Writes `value` as pretty JSON and a newline.
pub fn write_json(out: &mut impl Write, value: &Value) -> io::Result<()> {
    serde_json::to_writer_pretty(&mut *out, value).map_err(io::Error::from)?;
    writeln!(out)
}

/// How a holder reads in a sentence: `OWNER (fence F)`.
pub fn describe(holder: &Holder) -> String {
    format!("{} (fence {})", printable(&holder.owner), holder.fence)
}

/// How a grant reads in a sentence: `OWNER (fence F)`, for a permit
/// `OWNER (fence F, permit S of N)`, for a reader-writer lock's `OWNER
/// (fence F, read)` or `(fence F, write)`.
pub fn describe_grant(listed: &Listed) -> String {
    let holder = &listed.holder;
    match (listed.permit, listed.access) {
        (Some(p), _) => format!(
            "{} (fence {}, permit {} of {})",
            printable(&holder.owner),
            holder.fence,
            p.slot,
            p.permits
        ),
        (None, Some(access)) => format!(
            "{} (fence {}, {access})",
            printable(&holder.owner),
            holder.fence
        ),
        (None, None) => describe(holder),
    }
}

/// Writes one line of `watch` — the UTC time `at`, then who holds the name
/// (`held by OWNER (fence F, expires in D)`; for a semaphore `K of N
/// permits held: OWNER (fence F, expires in D), …`; for a reader-writer
/// lock `written by OWNER (…)` or `read by K: OWNER (…), …`) or `free` —
/// and flushes it.
pub fn watch_line(out: &mut impl Write, at: SystemTime, grants: &[Listed]) -> io::Result<()> {
    let at = utc_timestamp(at);
    let held = |holder: &Holder| {
        format!(
            "{} (fence {}, expires in {})",
            printable(&holder.owner),
            holder.fence,
            duration(holder.expires_in)
        )
    };
    match grants {
        [] => writeln!(out, "{at}  free")?,
        [lock] if is_lock(lock) => writeln!(out, "{at}  held by {}", held(&lock.holder))?,
        [writer] if writer.access == Some(Access::Write) => {
            writeln!(out, "{at}  written by {}", held(&writer.holder))?
        }
        readers if readers.iter().any(|r| r.access.is_some()) => {
            let holders: Vec<String> = readers.iter().map(|r| held(&r.holder)).collect();
            writeln!(
                out,
                "{at}  read by {}: {}",
                readers.len(),
                holders.join(", ")
            )?
        }
        permits => {
            let of = permits
                .iter()
                .find_map(|p| p.permit)
                .map_or(0, |p| p.permits);
            let holders: Vec<String> = permits.iter().map(|p| held(&p.holder)).collect();
            writeln!(
                out,
                "{at}  {} of {of} permits held: {}",
                permits.len(),
                holders.join(", ")
            )?
        }
    }
    out.flush()
}

/// `text` with control characters escaped, so that nothing read from the
/// store can drive the terminal.
pub fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Whole milliseconds of `d` (saturating).
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A lease duration the way an operator reads it: `29.8s`, `4m05s`,
/// `2h03m`, `3d04h`. Rounded down, so a lease never looks longer than it is.
pub fn duration(d: Duration) -> String {
    let secs = d.as_secs();
    if secs < 60 {
        format!("{secs}.{}s", d.subsec_millis() / 100)
    } else if secs < 3_600 {
        format!("{}m{:02}s", secs / 60, secs % 60)
    } else if secs < 86_400 {
        format!("{}h{:02}m", secs / 3_600, secs % 3_600 / 60)
    } else {
        format!("{}d{:02}h", secs / 86_400, secs % 86_400 / 3_600)
    }
}

/// `at` in UTC as ISO 8601 with milliseconds: `2024-05-01T12:34:56.789Z`.
/// A time before 1970 prints as the epoch.
pub fn utc_timestamp(at: SystemTime) -> String {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    // At most u64::MAX / 86_400 (about 2e14): fits an i64.
    let days = i64::try_from(secs / 86_400).unwrap_or(i64::MAX / 2);
    let (year, month, day) = civil_from_days(days);
    let of_day = secs % 86_400;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        of_day / 3_600,
        of_day % 3_600 / 60,
        of_day % 60,
        since.subsec_millis()
    )
}

/// The proleptic Gregorian (year, month, day) of a count of days since
/// 1970-01-01 (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // [0, 146096]
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11], March first
    let day = doy - (153 * mp + 2) / 5 + 1; // [1, 31]
    let month = if mp < 10 { mp + 3 } else { mp - 9 }; // [1, 12]
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(owner: &str, fence: u64, ms: u64) -> Holder {
        Holder {
            owner: owner.to_owned(),
            fence,
            expires_in: Duration::from_millis(ms),
        }
    }

    /// A listed grant; `permit` is (slot, permits).
    fn listed(name: &str, holder: Holder, permit: Option<(u32, u32)>) -> Listed {
        Listed {
            name: name.to_owned(),
            holder,
            permit: permit.map(|(slot, permits)| alkstore::PermitSlot { slot, permits }),
            access: None,
        }
    }

    #[test]
    fn durations_read_like_an_operator_reads_them() {
        assert_eq!(duration(Duration::from_millis(29_876)), "29.8s");
        assert_eq!(duration(Duration::from_millis(999)), "0.9s");
        assert_eq!(duration(Duration::ZERO), "0.0s");
        assert_eq!(duration(Duration::from_secs(245)), "4m05s");
        assert_eq!(
            duration(Duration::from_secs(2 * 3_600 + 3 * 60 + 9)),
            "2h03m"
        );
        assert_eq!(
            duration(Duration::from_secs(3 * 86_400 + 4 * 3_600)),
            "3d04h"
        );
    }

    #[test]
    fn timestamps_are_utc_iso_8601() {
        assert_eq!(utc_timestamp(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let at = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        assert_eq!(utc_timestamp(at), "2023-11-14T22:13:20.123Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(utc_timestamp(leap), "2000-02-29T00:00:00.000Z");
        let new_year = UNIX_EPOCH + Duration::from_secs(1_704_067_199);
        assert_eq!(utc_timestamp(new_year), "2023-12-31T23:59:59.000Z");
    }

    #[test]
    fn tables_align_their_columns() {
        let a = holder("owner-a", 7, 29_876);
        let b = holder("o", 12_345, 1_000);
        let mut out = Vec::new();
        let rows = [
            listed("jobs/a", a, None),
            listed("jobs/long-name", b, Some((2, 10))),
        ];
        table(&mut out, &rows.iter().collect::<Vec<_>>()).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "NAME            GRANT    OWNER    FENCE  EXPIRES IN",
                "jobs/a          -        owner-a      7       29.8s",
                "jobs/long-name  2 of 10  o        12345        1.0s",
            ]
        );
    }

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(printable("a\u{1b}[2Jb\n"), "a\\u{1b}[2Jb\\n");
        assert_eq!(printable("plain é"), "plain é");
    }

    #[test]
    fn json_entries_have_the_pinned_fields() {
        let value = entry_json(&listed("jobs/a", holder("owner-a", 7, 1_500), None));
        assert_eq!(
            value,
            json!({"name": "jobs/a", "owner": "owner-a", "fence": 7, "expires_in_ms": 1500,
                   "slot": null, "permits": null, "access": null})
        );
        let value = entry_json(&listed("pool", holder("w", 9, 1_000), Some((1, 3))));
        assert_eq!(
            value,
            json!({"name": "pool", "owner": "w", "fence": 9, "expires_in_ms": 1000,
                   "slot": 1, "permits": 3, "access": null})
        );
        let mut reader = listed("shared", holder("r", 11, 1_000), None);
        reader.access = Some(Access::Read { slot: 2 });
        assert_eq!(
            entry_json(&reader),
            json!({"name": "shared", "owner": "r", "fence": 11, "expires_in_ms": 1000,
                   "slot": 2, "permits": null, "access": "read"})
        );
    }

    #[test]
    fn watch_lines_say_who_holds_or_free() {
        let mut out = Vec::new();
        let lock = [listed("n", holder("w1", 3, 2_000), None)];
        watch_line(&mut out, UNIX_EPOCH, &lock).unwrap();
        watch_line(&mut out, UNIX_EPOCH, &[]).unwrap();
        let permits = [
            listed("p", holder("a", 4, 1_000), Some((0, 3))),
            listed("p", holder("b", 5, 3_000), Some((2, 3))),
        ];
        watch_line(&mut out, UNIX_EPOCH, &permits).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "1970-01-01T00:00:00.000Z  held by w1 (fence 3, expires in 2.0s)\n\
             1970-01-01T00:00:00.000Z  free\n\
             1970-01-01T00:00:00.000Z  2 of 3 permits held: a (fence 4, expires in 1.0s), \
             b (fence 5, expires in 3.0s)\n"
        );
    }
}
