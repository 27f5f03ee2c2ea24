//! Fences: a grant's fence is its key's revision (the revision of the
//! transaction that granted it, strictly above every earlier revision of
//! the cluster, whichever member leads) plus the store's fence base, which
//! `raise_fences` raises (after a restore from a snapshot, which takes
//! revisions back).

use alkstore_core::{BoxError, MAX_FENCE, NoFenceLeft};

use crate::client::{self, Client, Is, Target, Txn};
use crate::keys::Layout;
use crate::proto::mvccpb::KeyValue;

/// The store's fence base, and the mod revision of its key (0: never
/// raised), which every grant's transaction compares with the base it
/// read, so that a grant never pairs an old base with a revision after a
/// raise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Base {
    pub(crate) value: u64,
    pub(crate) mod_revision: i64,
}

impl Base {
    /// The base a read of its key found (none: 0).
    pub(crate) fn from_read(kv: Option<&KeyValue>) -> Result<Base, BoxError> {
        let Some(kv) = kv else {
            return Ok(Base::default());
        };
        let value = std::str::from_utf8(&kv.value)
            .ok()
            .and_then(|v| v.parse().ok())
            .ok_or("the fence base key holds no number: the prefix is not an alkstore store's")?;
        Ok(Base {
            value,
            mod_revision: kv.mod_revision,
        })
    }
}

/// The fence of a grant at `revision` over `base`.
pub(crate) fn of(base: u64, revision: i64) -> u64 {
    base.saturating_add(u64::try_from(revision).unwrap_or(0))
}

/// Refuses a grant, decided on a read at `revision`, whose fence would be
/// above [`MAX_FENCE`] even if nothing else were written before it. (Other
/// writes may come between: the grant is checked again once its revision
/// is known, [`past_the_end`].)
pub(crate) fn check_room(base: u64, revision: i64) -> Result<(), BoxError> {
    match past_the_end(base, revision.saturating_add(1)) {
        true => Err(NoFenceLeft { left: 0 }.into()),
        false => Ok(()),
    }
}

/// Whether a grant at `revision` over `base` would have a fence past
/// [`MAX_FENCE`].
pub(crate) fn past_the_end(base: u64, revision: i64) -> bool {
    of(base, revision) > MAX_FENCE
}

/// How many times a raise reads again after another raise changed the
/// base under it.
const RAISES: usize = 16;

/// Reads the store's fence base.
pub(crate) async fn read_base(client: &Client, layout: &Layout) -> Result<Base, BoxError> {
    let read = client.range(layout.base(), Vec::new(), 1).await?;
    Base::from_read(read.kvs.first())
}

/// Raises the base by `by` (checked by the core) and answers the lowest
/// fence a later grant can get: every later grant's revision is above the
/// raise's own, so its fence is above every fence handed out before the
/// raise began (each at most the old base plus a revision before the
/// raise's) by more than `by`.
pub(crate) async fn raise(client: &Client, layout: &Layout, by: u64) -> Result<u64, BoxError> {
    for _ in 0..RAISES {
        let read = client
            .txn(Txn::new().read(layout.base(), Vec::new()))
            .await?;
        let revision = client::revision(&read);
        let reads = client::reads(read);
        let base = Base::from_read(reads.first().and_then(|r| r.kvs.first()))?;
        let highest = of(base.value, revision);
        let raised = base.value.saturating_add(by);
        // The raise's own revision is at least `revision + 1`; a later
        // grant's at least one more. (Other writes between the read and the
        // raise can take that further: a grant past the end is then
        // refused when its revision is known.)
        if of(raised, revision.saturating_add(2)) > MAX_FENCE {
            return Err(NoFenceLeft {
                left: MAX_FENCE.saturating_sub(highest),
            }
            .into());
        }
        let write = Txn::new()
            .when(
                layout.base(),
                Vec::new(),
                Target::Mod,
                Is::Equal,
                base.mod_revision,
            )
            .put(layout.base(), raised.to_string().into_bytes(), 0);
        let answer = client.txn(write).await?;
        if answer.succeeded {
            return Ok(of(raised, client::revision(&answer).saturating_add(1)));
        }
    }
    Err("the fence base changed under every try to raise it (other raises at once)".into())
}
