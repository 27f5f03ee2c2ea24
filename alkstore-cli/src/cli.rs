//! The command line, as clap derive definitions: the global `--url` and one
//! subcommand per operation.

use std::num::NonZeroUsize;

use clap::{Parser, Subcommand};

/// The exit codes, shown at the end of `--help`.
pub const EXIT_CODES_HELP: &str = "\
Exit codes:
  0  success
  1  nothing there: `show` found the name free, `release` found it free
  2  usage error
  3  error from the store or the URL
  4  aborted at the confirmation prompt
  5  doctor: a promise is given up, or a setting could not be read

The URL may come from ALKSTORE_URL instead of --url. No password is ever printed.";

/// The operator's tool for alkstore locks: list the live holders, show one,
/// force-release a stuck lock, purge expired rows, watch a name.
// No `Debug`: it holds the store URL, password included. (A `//` comment:
// clap would show a `///` paragraph in `--help`.)
#[derive(Parser)]
#[command(name = "alkstore", version, after_help = EXIT_CODES_HELP)]
pub struct Cli {
    /// The store: sqlite://locks.db (relative path), sqlite:///var/lib/app/locks.db
    /// (absolute), postgres://user@host/db?schema=name, mysql://user@host/database,
    /// etcd://host:2379,host2:2379/prefix
    #[arg(long, value_name = "URL", env = "ALKSTORE_URL", hide_env_values = true)]
    pub url: String,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// What to do: inspect the deployment, or an operation on the store.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Read the server's durability and replication settings and say, for
    /// each promise (one holder per name, no answered grant lost in a crash,
    /// none lost in a failover, fences rising across one), whether this
    /// deployment keeps it and which setting gives it up. Opens no store and
    /// creates nothing. Exit 0 when every promise is kept (or does not
    /// apply), 5 when one is given up or a setting could not be read.
    Doctor {
        /// Print a JSON object {"engine", "server", "settings", "promises",
        /// "worst"} instead of a table.
        #[arg(long)]
        json: bool,
    },

    /// An operation on the store.
    #[command(flatten)]
    Store(StoreCommand),
}

/// One operation on the store.
#[derive(Debug, Subcommand)]
pub enum StoreCommand {
    /// List the live holders whose names start with a prefix, in name order.
    List {
        /// Only names starting with this (default: every name).
        #[arg(long, value_name = "P", default_value = "", hide_default_value = true)]
        prefix: String,
        /// List at most this many names.
        #[arg(long, value_name = "N")]
        limit: Option<NonZeroUsize>,
        /// Print a JSON array of {"name", "owner", "fence", "expires_in_ms",
        /// "slot", "permits"} (the last two null for a lock) instead of a
        /// table.
        #[arg(long)]
        json: bool,
    },

    /// Show the live holder of one name, or each live permit of a
    /// semaphore, and the calls waiting for it in turn (exit 1 when it is
    /// free).
    Show {
        /// The lock name.
        name: String,
        /// Print a JSON object {"name", "owner", "fence", "expires_in_ms",
        /// "slot": null, "permits": null} for a lock, an array of such
        /// objects for a semaphore's permits, or null when the name is
        /// free, instead of a table.
        #[arg(long)]
        json: bool,
    },

    /// Remove the live grant of a name, whoever holds it (exit 1 when it is
    /// free). Its holder's next renew or release answers false; the next
    /// grant gets a higher fence. A semaphore's permits go one at a time:
    /// name one with --fence.
    Release {
        /// Required: says you mean to take the lock away from its holder.
        #[arg(long, required = true)]
        force: bool,
        /// Do not ask for confirmation.
        #[arg(long, short = 'y')]
        yes: bool,
        /// Remove only the live grant of this fence (`show` lists them):
        /// one permit of a semaphore, or a lock's grant only if it is still
        /// that one (exit 1 otherwise).
        #[arg(long, value_name = "F")]
        fence: Option<u64>,
        /// The lock name.
        name: String,
    },

    /// Delete every expired lock row and print how many.
    Purge {
        /// Print {"purged": N} instead of a sentence.
        #[arg(long)]
        json: bool,
    },

    /// Raise the fences: every grant after this gets a fence at least BY
    /// above every fence handed out before. For what the store cannot see by
    /// itself: a restore from a backup or into a new cluster, two MariaDB
    /// promotions inside one replication lag (docs/failover.md). Never
    /// lowers a fence; retires the live grants (their renewals answer
    /// false; their owners asking again get new fences).
    RaiseFences {
        /// How far (2^20 to 2^56; default 2^40, above any number of grants
        /// a lost server can have handed out).
        #[arg(long, value_name = "N", default_value_t = alkstore::DEFAULT_FENCE_RAISE)]
        by: u64,
        /// Print {"raised_by": N, "next_fence_at_least": M} instead of a sentence.
        #[arg(long)]
        json: bool,
    },

    /// Print a line, with a UTC timestamp, each time the holder of a name
    /// changes; runs until Ctrl-C.
    Watch {
        /// The lock name.
        name: String,
        /// How often to look, in milliseconds.
        #[arg(
            long,
            value_name = "MS",
            default_value_t = 500,
            value_parser = clap::value_parser!(u64).range(1..)
        )]
        interval: u64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn release_needs_force() {
        let refused = Cli::try_parse_from(["alkstore", "--url", "sqlite::memory:", "release", "x"]);
        assert!(refused.is_err());
        let parsed = Cli::try_parse_from([
            "alkstore",
            "--url",
            "sqlite::memory:",
            "release",
            "--force",
            "x",
            "--yes",
        ])
        .ok()
        .map(|cli| cli.command);
        assert!(
            matches!(parsed, Some(Command::Store(StoreCommand::Release { force: true, yes: true, fence: None, ref name })) if name == "x"),
            "{parsed:?}"
        );
    }
}
