//! What `alkstore doctor` reports of a deployment: the server's durability
//! and replication settings, and for each promise of the contract whether
//! this deployment keeps it — and if not, which setting gives it up.
//!
//! An engine reads its settings without opening a store (nothing is
//! created) and judges them in [`Report::new`]'s findings;
//! [`EngineDescriptor::inspect`](crate::EngineDescriptor::inspect) is how
//! `alkstore::inspect` reaches it from a URL.
//!
//! ```
//! use alkstore_core::doctor::{Finding, Promise, Report, Verdict};
//!
//! let report = Report::new(
//!     "postgres",
//!     "127.0.0.1:5432",
//!     vec![("fsync".into(), "off".into())],
//!     vec![Finding::given_up(Promise::NoGrantLostInACrash, "fsync = off")],
//! );
//! assert_eq!(report.worst(), Verdict::GivenUp);
//! ```

use std::future::Future;
use std::pin::Pin;

/// A promise of the contract (docs/contract.md) that a deployment may keep
/// or give up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Promise {
    /// At most one live grant per name while one server is the primary.
    Exclusion,
    /// A grant or renewal the store answered survives a crash of the server.
    NoGrantLostInACrash,
    /// A grant or renewal the store answered is on the server a failover
    /// promotes.
    NoGrantLostInAFailover,
    /// Every fence a promoted server hands out is above every fence handed
    /// out before the failover.
    FencesRiseAcrossAFailover,
}

impl Promise {
    /// Every promise, in the order a report lists them.
    pub const ALL: [Promise; 4] = [
        Promise::Exclusion,
        Promise::NoGrantLostInACrash,
        Promise::NoGrantLostInAFailover,
        Promise::FencesRiseAcrossAFailover,
    ];

    /// A short key, for JSON and scripts: `exclusion`,
    /// `no_grant_lost_in_a_crash`, `no_grant_lost_in_a_failover`,
    /// `fences_rise_across_a_failover`.
    pub fn key(self) -> &'static str {
        match self {
            Promise::Exclusion => "exclusion",
            Promise::NoGrantLostInACrash => "no_grant_lost_in_a_crash",
            Promise::NoGrantLostInAFailover => "no_grant_lost_in_a_failover",
            Promise::FencesRiseAcrossAFailover => "fences_rise_across_a_failover",
        }
    }

    /// The promise in words, for a table.
    pub fn describe(self) -> &'static str {
        match self {
            Promise::Exclusion => "one holder per name",
            Promise::NoGrantLostInACrash => "no answered grant lost in a crash",
            Promise::NoGrantLostInAFailover => "no answered grant lost in a failover",
            Promise::FencesRiseAcrossAFailover => "fences rise across a failover",
        }
    }
}

/// Whether a deployment keeps a promise. Ordered from best to worst.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verdict {
    /// Nothing to keep: no failover for an embedded file, say.
    NotApplicable,
    /// Kept, by these settings.
    Kept,
    /// The settings could not all be read (the role lacks a right): the
    /// reason says which and what to grant.
    Unknown,
    /// Given up by the setting the reason names.
    GivenUp,
}

impl Verdict {
    /// A short key, for JSON and tables: `n/a`, `kept`, `unknown`, `given up`.
    pub fn key(self) -> &'static str {
        match self {
            Verdict::NotApplicable => "n/a",
            Verdict::Kept => "kept",
            Verdict::Unknown => "unknown",
            Verdict::GivenUp => "given up",
        }
    }
}

/// One promise judged, with the settings that decide it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The promise.
    pub promise: Promise,
    /// Whether it is kept.
    pub verdict: Verdict,
    /// Why: the settings that keep it, or the one that gives it up.
    pub because: String,
}

impl Finding {
    /// A finding of `verdict`.
    pub fn new(promise: Promise, verdict: Verdict, because: impl Into<String>) -> Self {
        Finding {
            promise,
            verdict,
            because: because.into(),
        }
    }

    /// Kept, because of `because`.
    pub fn kept(promise: Promise, because: impl Into<String>) -> Self {
        Self::new(promise, Verdict::Kept, because)
    }

    /// Given up, by `because`.
    pub fn given_up(promise: Promise, because: impl Into<String>) -> Self {
        Self::new(promise, Verdict::GivenUp, because)
    }
}

/// A deployment inspected: where, what its settings are, and each promise
/// judged. Made with [`Report::new`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Report {
    /// The engine's name (`sqlite`, `postgres`, `mysql`).
    pub engine: &'static str,
    /// Where the server is (host and port, or a path); never a password.
    pub server: String,
    /// The settings read, by name, in the order read.
    pub settings: Vec<(String, String)>,
    /// One finding per promise, in [`Promise::ALL`]'s order.
    pub findings: Vec<Finding>,
    /// What the deployment does to the store apart from the promises (a
    /// pooler it was not told of, say): each a sentence naming the fix.
    /// `alkstore doctor` exits 5 when there is one.
    pub warnings: Vec<String>,
    /// The server that answered is a standby (read-only, in recovery): what
    /// it shows may be behind the primary's.
    pub standby: bool,
}

impl Report {
    /// A report; the findings are put in [`Promise::ALL`]'s order.
    pub fn new(
        engine: &'static str,
        server: impl Into<String>,
        settings: Vec<(String, String)>,
        mut findings: Vec<Finding>,
    ) -> Self {
        findings.sort_by_key(|f| Promise::ALL.iter().position(|p| *p == f.promise));
        Report {
            engine,
            server: server.into(),
            settings,
            findings,
            warnings: Vec::new(),
            standby: false,
        }
    }

    /// With `warnings` added.
    pub fn with_warnings(mut self, warnings: impl IntoIterator<Item = String>) -> Self {
        self.warnings.extend(warnings);
        self
    }

    /// Saying whether the server that answered is a standby.
    pub fn with_standby(mut self, standby: bool) -> Self {
        self.standby = standby;
        self
    }

    /// The worst verdict of the report ([`Verdict::NotApplicable`] when it
    /// has none).
    pub fn worst(&self) -> Verdict {
        self.findings
            .iter()
            .map(|f| f.verdict)
            .max()
            .unwrap_or(Verdict::NotApplicable)
    }

    /// The finding on `promise`, if the report has one.
    pub fn finding(&self, promise: Promise) -> Option<&Finding> {
        self.findings.iter().find(|f| f.promise == promise)
    }

    /// The value of the setting line `name`, if the report has one.
    ///
    /// ```
    /// use alkstore_core::doctor::Report;
    /// let report = Report::new("etcd", "h:2379", vec![("version".into(), "3.5.14".into())], vec![]);
    /// assert_eq!(report.setting("version"), Some("3.5.14"));
    /// assert_eq!(report.setting("leader"), None);
    /// ```
    pub fn setting(&self, name: &str) -> Option<&str> {
        self.settings
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The name of the doctor's setting line on the fence space's headroom.
pub const FENCES_LEFT: &str = "fences left";

/// The doctor's line on the fence space: how many fences are left up to
/// [`MAX_FENCE`](crate::MAX_FENCE) when `next` is the lowest fence a later
/// grant can get — grants, and raises by [`DEFAULT_FENCE_RAISE`](crate::DEFAULT_FENCE_RAISE)
/// — or what kept it from being read.
pub fn fences_left(next: Result<u64, String>) -> (String, String) {
    let shown = match next {
        Ok(next) => {
            let left = crate::MAX_FENCE.saturating_sub(next.saturating_sub(1));
            format!(
                "{left} grants, {} raises of 2^40 (the end: {})",
                left / crate::DEFAULT_FENCE_RAISE,
                crate::MAX_FENCE
            )
        }
        Err(why) => why,
    };
    (FENCES_LEFT.to_owned(), shown)
}

/// The future of [`EngineDescriptor::inspect`](crate::EngineDescriptor::inspect).
pub type InspectFuture<'a> = Pin<Box<dyn Future<Output = crate::Result<Report>> + Send + 'a>>;

/// An engine's inspection as [`EngineDescriptor::inspect`](crate::EngineDescriptor::inspect)
/// answers it: its error an [`Error::Database`](crate::Error::Database) of
/// the operation `inspect`, with the cause as its source.
pub fn inspecting<'a>(
    report: impl Future<Output = Result<Report, crate::BoxError>> + Send + 'a,
) -> InspectFuture<'a> {
    Box::pin(async move {
        report
            .await
            .map_err(|e| crate::Error::database("inspect", e))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn findings_come_in_the_order_of_the_promises_and_the_worst_wins() {
        let report = Report::new(
            "test",
            "here",
            Vec::new(),
            vec![
                Finding::given_up(Promise::FencesRiseAcrossAFailover, "x"),
                Finding::kept(Promise::Exclusion, "y"),
                Finding::new(Promise::NoGrantLostInACrash, Verdict::Unknown, "z"),
            ],
        );
        let order: Vec<Promise> = report.findings.iter().map(|f| f.promise).collect();
        assert_eq!(
            order,
            [
                Promise::Exclusion,
                Promise::NoGrantLostInACrash,
                Promise::FencesRiseAcrossAFailover
            ]
        );
        assert_eq!(report.worst(), Verdict::GivenUp);
        assert_eq!(
            Report::new("test", "here", Vec::new(), Vec::new()).worst(),
            Verdict::NotApplicable
        );
    }
}
