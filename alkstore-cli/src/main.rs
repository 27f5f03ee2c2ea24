//! `alkstore`: the operator's tool for alkstore locks.
//!
//! ```text
//! alkstore --url URL list [--prefix P] [--limit N] [--json]
//! alkstore --url URL show NAME [--json]
//! alkstore --url URL release --force NAME [--fence F] [--yes]
//! alkstore --url URL purge [--json]
//! alkstore --url URL raise-fences [--by N] [--json]
//! alkstore --url URL watch NAME [--interval MS]
//! alkstore --url URL doctor [--json]
//! ```
//!
//! The URL may come from the `ALKSTORE_URL` environment variable instead of
//! `--url`. No password is ever printed: `--help` hides the variable's value,
//! the URL itself is never echoed, and every line of error output has each
//! form of the URL's password replaced by `****`.
//!
//! Exit codes:
//! - 0: success;
//! - 1: nothing there (`show`: the name is free; `release`: it was free);
//! - 2: usage error (clap's own);
//! - 3: an error from the store or the URL;
//! - 4: aborted at the confirmation prompt of `release`, or confirmed but
//!   nothing removed: another grant held the name by then (the answer
//!   removes only the grant that was shown);
//! - 5: `doctor`: a promise is given up, or a setting could not be read.
//!
//! Errors print to stderr as `alkstore: <error>`, then one
//! `  caused by: <source>` line for each source in the chain.

mod cli;
mod commands;
mod output;
mod redact;

use std::error::Error;
use std::io::{self, Write};
use std::process::ExitCode;

use clap::Parser;

use crate::redact::Redactor;

/// The exit code of an error from the store or the URL.
const EXIT_ERROR: u8 = 3;

/// Parses the command line, runs the command on a single-threaded tokio
/// runtime and maps how it ended to the exit code.
fn main() -> ExitCode {
    let cli::Cli { url, command } = cli::Cli::parse();
    let redactor = Redactor::for_url(&url);
    let result = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(alkstore::BoxError::from)
        .and_then(|runtime| runtime.block_on(commands::run(&url, command)));
    match result {
        Ok(outcome) => ExitCode::from(outcome.code()),
        // The reader went away (`alkstore list | head`): nothing to say.
        Err(err) if is_broken_pipe(&*err) => ExitCode::SUCCESS,
        Err(err) => {
            report(&redactor, &*err);
            ExitCode::from(EXIT_ERROR)
        }
    }
}

/// `err` and its sources, outermost first.
fn chain<'a>(err: &'a (dyn Error + 'static)) -> Vec<&'a (dyn Error + 'static)> {
    let mut all = Vec::new();
    let mut next = Some(err);
    while let Some(err) = next {
        all.push(err);
        next = err.source();
    }
    all
}

/// Whether `err` is a write to a closed pipe.
fn is_broken_pipe(err: &(dyn Error + 'static)) -> bool {
    chain(err).into_iter().any(|err| {
        err.downcast_ref::<io::Error>()
            .is_some_and(|io| io.kind() == io::ErrorKind::BrokenPipe)
    })
}

/// Prints `err` on stderr as `alkstore: <error>` and a `  caused by:` line
/// per source, each line with the URL's password masked.
fn report(redactor: &Redactor, err: &(dyn Error + 'static)) {
    let mut stderr = io::stderr().lock();
    for (depth, err) in chain(err).into_iter().enumerate() {
        let lead = if depth == 0 {
            "alkstore: "
        } else {
            "  caused by: "
        };
        let line = redactor.redact(&format!("{lead}{err}"));
        let _ = writeln!(stderr, "{line}");
    }
    let _ = stderr.flush();
}
