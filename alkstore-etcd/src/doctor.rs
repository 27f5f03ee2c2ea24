//! `alkstore doctor` for etcd: the members, the leader, the version and
//! the store's fence headroom, read without writing; the contract's
//! promises judged by the number of voting members.

use alkstore_core::doctor::{Finding, InspectFuture, Promise, Report, Verdict, inspecting};

use crate::client::Client;
use crate::keys::Layout;
use crate::proto::etcdserverpb::{Member, MemberListRequest, StatusRequest};

/// Whether etcd `version` has the lease bugs of leader changes fixed in
/// 3.4.32 and 3.5.14 (etcd-io/etcd#15247, #17642).
fn has_lease_bugs(version: &str) -> bool {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor, patch) = (
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
    );
    match (major, minor) {
        (3, 4) => patch < 32,
        (3, 5) => patch < 14,
        (3, minor) => minor < 4,
        (major, _) => major < 3,
    }
}

/// `3.4.23` as numbers, to find the oldest of several.
fn version_key(version: &str) -> Vec<u32> {
    version
        .split('.')
        .map(|p| p.parse::<u32>().unwrap_or(0))
        .collect()
}

/// Every member's version, asked of the member itself at the first
/// client URL it advertises (a cluster being upgraded runs several), all
/// at once: `(name, version or why unknown)`.
async fn member_versions(
    members: &[Member],
    options: &crate::client::Options,
) -> Vec<(String, Result<String, String>)> {
    let asked = members.iter().map(|member| async move {
        let Some(url) = member.client_ur_ls.first() else {
            return Err("no client URL (not started yet)".to_owned());
        };
        let endpoint = url.split_once("://").map_or(url.as_str(), |(_, rest)| rest);
        let endpoint = endpoint.trim_end_matches('/').to_owned();
        let one = Client::connect(std::slice::from_ref(&endpoint), options)
            .map_err(|e| format!("cannot reach {endpoint}: {e}"))?;
        one.call_on(0, None, |mut m| async move {
            Ok(m.maintenance
                .status(StatusRequest::default())
                .await?
                .into_inner())
        })
        .await
        .map(|status| status.version)
        .map_err(|e| format!("no answer at {endpoint}: {}", e.message()))
    });
    let versions = futures::future::join_all(asked).await;
    members
        .iter()
        .map(|m| m.name.clone())
        .zip(versions)
        .collect()
}

/// Inspects the cluster `url` names.
pub(crate) fn inspect_url(url: &str) -> InspectFuture<'_> {
    inspecting(async move {
        let parsed = crate::url::parse(url)?;
        let client = Client::connect(&parsed.endpoints, &parsed.options)?;
        let layout = Layout::new(parsed.prefix.clone());
        let members = client
            .call(|mut m| async move {
                Ok(m.cluster
                    .member_list(MemberListRequest::default())
                    .await?
                    .into_inner())
            })
            .await?
            .members;
        let status = client
            .call(|mut m| async move {
                Ok(m.maintenance
                    .status(StatusRequest::default())
                    .await?
                    .into_inner())
            })
            .await?;
        let voters = members.iter().filter(|m| !m.is_learner).count();
        let leader = members
            .iter()
            .find(|m| m.id == status.leader)
            .map_or_else(|| "none".to_owned(), |m| m.name.clone());
        let revision = status.header.as_ref().map_or(0, |h| h.revision);
        let base = crate::fence::read_base(&client, &layout).await;
        let next = base
            .map(|base| crate::fence::of(base.value, revision.saturating_add(1)))
            .map_err(|e| format!("unknown: {e}"));
        // The promises are judged by the oldest member that answered (the
        // one answering here if none did); a member that did not answer
        // leaves exclusion unknown.
        let versions = member_versions(&members, &parsed.options).await;
        let version = versions
            .iter()
            .filter_map(|(_, v)| v.as_ref().ok())
            .min_by_key(|v| version_key(v))
            .cloned()
            .unwrap_or_else(|| status.version.clone());
        let settings = vec![
            ("version".to_owned(), version.clone()),
            (
                "member versions".to_owned(),
                versions
                    .iter()
                    .map(|(name, v)| match v {
                        Ok(v) => format!("{name} {v}"),
                        Err(_) => format!("{name} unknown"),
                    })
                    .collect::<Vec<_>>()
                    .join(", "),
            ),
            (
                "members".to_owned(),
                members
                    .iter()
                    .map(|m| match m.is_learner {
                        true => format!("{} (learner)", m.name),
                        false => m.name.clone(),
                    })
                    .collect::<Vec<_>>()
                    .join(", "),
            ),
            ("leader".to_owned(), leader),
            ("revision".to_owned(), revision.to_string()),
            ("prefix".to_owned(), layout.prefix().to_owned()),
            alkstore_core::doctor::fences_left(next),
        ];
        let failover = match voters {
            0..=2 => Finding::given_up(
                Promise::NoGrantLostInAFailover,
                format!(
                    "{voters} voting member(s): losing one loses the quorum (no failover); run 3 or 5"
                ),
            ),
            _ => Finding::kept(
                Promise::NoGrantLostInAFailover,
                format!(
                    "{voters} voting members: a grant is answered once a majority has it, and a new leader has every write a majority has"
                ),
            ),
        };
        let unanswered: Vec<&str> = versions
            .iter()
            .filter(|(_, v)| v.is_err())
            .map(|(name, _)| name.as_str())
            .collect();
        let lease_bugs = has_lease_bugs(&version);
        let exclusion = match lease_bugs {
            false if !unanswered.is_empty() => Finding::new(
                Promise::Exclusion,
                Verdict::Unknown,
                format!(
                    "the version of {} is unknown (see the warnings): a member before 3.4.32 or \
                     3.5.14 can end a lease early after a leader change",
                    unanswered.join(", ")
                ),
            ),
            true => Finding::given_up(
                Promise::Exclusion,
                format!(
                    "etcd {version} (the oldest member) can end a lease early when a stale leader \
                     revokes it after a leader change (etcd-io/etcd#15247), and report a lease \
                     292 years long (#17642): upgrade every member to 3.4.32, 3.5.14 or later"
                ),
            ),
            false => Finding::kept(
                Promise::Exclusion,
                "every grant is one transaction on the Raft log, compared against the name's keys",
            ),
        };
        let mut warnings: Vec<String> = versions
            .iter()
            .filter_map(|(name, v)| {
                v.as_ref().err().map(|why| {
                    format!("member {name}'s version is unknown ({why}): judged without it")
                })
            })
            .collect();
        if !status.errors.is_empty() {
            warnings.push(format!(
                "the cluster reports alarms: {} (etcd refuses writes under a NOSPACE alarm: compact, defragment, disarm)",
                status.errors.join("; ")
            ));
        }
        Ok(Report::new(
            "etcd",
            parsed.endpoints.join(","),
            settings,
            vec![
                exclusion,
                Finding::kept(
                    Promise::NoGrantLostInACrash,
                    "etcd answers a write once it is in the write-ahead log of a majority, synced to disk",
                ),
                failover,
                Finding::new(
                    Promise::FencesRiseAcrossAFailover,
                    Verdict::Kept,
                    "fences are revisions, which a new leader continues; after restoring a snapshot run `alkstore raise-fences`",
                ),
            ],
        )
        .with_warnings(warnings))
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_lease_bugs_end_with_3_4_32_and_3_5_14() {
        for (version, buggy) in [
            ("3.4.23", true),
            ("3.4.32", false),
            ("3.5.13", true),
            ("3.5.14", false),
            ("3.6.0", false),
            ("3.3.27", true),
        ] {
            assert_eq!(super::has_lease_bugs(version), buggy, "{version}");
        }
    }
}
