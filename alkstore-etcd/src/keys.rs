//! Where a store's grants live in etcd's key space, and what a grant's key
//! holds.
//!
//! Under the store's prefix `P`:
//! - `P/g/<name>\0<slot>`: one key per live grant of `<name>`, attached to
//!   the grant's own lease (so that the lease's end removes it, and a
//!   watch sees that as a release). `<slot>` is `L` for a lock, `P00003`
//!   for a semaphore's permit 3, `R00003` for a reader's slot 3, `W` for a
//!   reader-writer lock's writer and `I` for a waiting writer's intent.
//!   Names hold no control character, so every key of a name sorts before
//!   the keys of the next name in the byte order of names, and one range
//!   read lists names in order.
//! - `P/g/<name>\0T<lease>`: one key per waiter in `<name>`'s queue (its
//!   ticket, docs/fair-waiting.md), on the waiter's own lease `<lease>`
//!   (16 hex digits), so that a dead waiter's place ends with its lease.
//!   Its number is its create revision: the cluster's order of the
//!   waiters' first refusals. Beside the grants, so that one read and one
//!   compare see a name's grants and queue together.
//! - `P/meta/fence-base`: what every fence is above its revision
//!   ([`crate::fence`]), raised by `raise_fences`.

use alkstore_core::TicketKind;

use crate::proto::mvccpb::KeyValue;

/// A grant's slot under its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot {
    /// A plain lock.
    Lock,
    /// A semaphore's permit.
    Permit(u32),
    /// A reader-writer lock's reader.
    Reader(u32),
    /// A reader-writer lock's writer.
    Writer,
    /// A waiting writer's intent (not a grant).
    Intent,
}

impl Slot {
    fn suffix(self) -> String {
        match self {
            Slot::Lock => "L".into(),
            Slot::Permit(slot) => format!("P{slot:05}"),
            Slot::Reader(slot) => format!("R{slot:05}"),
            Slot::Writer => "W".into(),
            Slot::Intent => "I".into(),
        }
    }

    fn parse(suffix: &str) -> Option<Slot> {
        let number = || suffix.get(1..)?.parse().ok();
        match suffix.as_bytes().first()? {
            b'L' if suffix.len() == 1 => Some(Slot::Lock),
            b'W' if suffix.len() == 1 => Some(Slot::Writer),
            b'I' if suffix.len() == 1 => Some(Slot::Intent),
            b'P' => number().map(Slot::Permit),
            b'R' => number().map(Slot::Reader),
            _ => None,
        }
    }
}

/// The keys of one store (one prefix).
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    prefix: String,
}

impl Layout {
    /// The store under `prefix` (ending in `/`).
    pub(crate) fn new(prefix: String) -> Self {
        debug_assert!(prefix.ends_with('/'));
        Layout { prefix }
    }

    /// The store's prefix.
    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Where every grant key starts.
    pub(crate) fn grants(&self) -> Vec<u8> {
        format!("{}g/", self.prefix).into_bytes()
    }

    /// The key that holds the fence base.
    pub(crate) fn base(&self) -> Vec<u8> {
        format!("{}meta/fence-base", self.prefix).into_bytes()
    }

    /// The first key of `name`'s grants.
    pub(crate) fn name_start(&self, name: &str) -> Vec<u8> {
        format!("{}g/{name}\0", self.prefix).into_bytes()
    }

    /// The end (exclusive) of `name`'s grant keys: above every key of
    /// `name`, below every key of a later name.
    pub(crate) fn name_end(&self, name: &str) -> Vec<u8> {
        format!("{}g/{name}\u{1}", self.prefix).into_bytes()
    }

    /// The key of `name`'s grant in `slot`.
    pub(crate) fn key(&self, name: &str, slot: Slot) -> Vec<u8> {
        format!("{}g/{name}\0{}", self.prefix, slot.suffix()).into_bytes()
    }

    /// Where `name`'s tickets start: `[tickets_start, tickets_end)` holds
    /// all of them, and no grant key.
    pub(crate) fn tickets_start(&self, name: &str) -> Vec<u8> {
        format!("{}g/{name}\0{TICKET}", self.prefix).into_bytes()
    }

    /// Where `name`'s tickets end (exclusive).
    pub(crate) fn tickets_end(&self, name: &str) -> Vec<u8> {
        format!("{}g/{name}\0{AFTER_TICKET}", self.prefix).into_bytes()
    }

    /// The key of a ticket in `name`'s queue, on `lease`.
    pub(crate) fn ticket(&self, name: &str, lease: i64) -> Vec<u8> {
        format!("{}g/{name}\0{TICKET}{lease:016x}", self.prefix).into_bytes()
    }

    /// The name and slot of a grant key of this store.
    pub(crate) fn parse(&self, key: &[u8]) -> Option<(String, Slot)> {
        let (name, suffix) = self.split(key)?;
        Some((name.to_owned(), Slot::parse(suffix)?))
    }

    /// The name of a ticket key of this store.
    pub(crate) fn parse_ticket(&self, key: &[u8]) -> Option<String> {
        let (name, suffix) = self.split(key)?;
        let lease = suffix.strip_prefix(TICKET)?;
        (lease.len() == 16 && lease.bytes().all(|b| b.is_ascii_hexdigit())).then(|| name.to_owned())
    }

    /// A key under the name range: its name and its suffix.
    fn split<'k>(&self, key: &'k [u8]) -> Option<(&'k str, &'k str)> {
        let rest = key.strip_prefix(self.grants().as_slice())?;
        std::str::from_utf8(rest).ok()?.split_once('\0')
    }
}

/// What starts a ticket key's suffix (no grant slot starts with it).
const TICKET: char = 'T';
/// The character after [`TICKET`]: the end of a name's tickets.
const AFTER_TICKET: char = 'U';

/// The end of the range of every key that starts with `prefix` (etcd's
/// "prefix end": the prefix with its last byte below 0xff raised).
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte 0xff: to the end of the key space.
    vec![0]
}

/// What a ticket's key holds. Its number is the key's create revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TicketValue {
    /// What it waits for.
    pub(crate) kind: TicketKind,
    /// A reader's: owed the next turn (`alkstore_core::queue`).
    pub(crate) owed: bool,
    /// When it was drawn, in ms since the Unix epoch by the drawing host's
    /// clock (etcd keeps no time): only for showing how long it waited.
    pub(crate) since_ms: u64,
    /// The owner that waits.
    pub(crate) owner: String,
}

const TICKET_TAG: &str = "alkq1";

impl TicketValue {
    /// The bytes stored.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let owed = u8::from(self.owed);
        format!(
            "{TICKET_TAG}\n{}\n{owed}\n{}\n{}",
            self.kind.as_str(),
            self.since_ms,
            self.owner
        )
        .into_bytes()
    }

    /// The value a ticket key holds, if it is one this build wrote.
    pub(crate) fn decode(bytes: &[u8]) -> Option<TicketValue> {
        let text = std::str::from_utf8(bytes).ok()?;
        let mut fields = text.splitn(5, '\n');
        if fields.next()? != TICKET_TAG {
            return None;
        }
        let kind = TicketKind::parse(fields.next()?)?;
        let owed = match fields.next()? {
            "0" => false,
            "1" => true,
            _ => return None,
        };
        let since_ms = fields.next()?.parse().ok()?;
        let owner = fields.next()?.to_owned();
        Some(TicketValue {
            kind,
            owed,
            since_ms,
            owner,
        })
    }
}

/// Which revision a grant's fence counts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FenceRevision {
    /// The key's create revision (a grant that created its key).
    Create,
    /// The key's mod revision (a grant that took its owner's key over).
    Mod,
    /// This revision (written when a renewal moved the key to a new lease,
    /// which changes its mod revision).
    At(i64),
}

/// What a grant's key holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GrantValue {
    /// The fence base when it was granted.
    pub(crate) base: u64,
    /// Which revision its fence counts from.
    pub(crate) revision: FenceRevision,
    /// A semaphore's permits (0 for other grants).
    pub(crate) permits: u32,
    /// The owner.
    pub(crate) owner: String,
}

const VERSION_TAG: &str = "alk1";

impl GrantValue {
    /// The bytes stored.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let revision = match self.revision {
            FenceRevision::Create => "c".to_owned(),
            FenceRevision::Mod => "m".to_owned(),
            FenceRevision::At(revision) => revision.to_string(),
        };
        format!(
            "{VERSION_TAG}\n{}\n{revision}\n{}\n{}",
            self.base, self.permits, self.owner
        )
        .into_bytes()
    }

    /// The value a key holds, if it is one this build wrote.
    pub(crate) fn decode(bytes: &[u8]) -> Option<GrantValue> {
        let text = std::str::from_utf8(bytes).ok()?;
        let mut fields = text.splitn(5, '\n');
        if fields.next()? != VERSION_TAG {
            return None;
        }
        let base = fields.next()?.parse().ok()?;
        let revision = match fields.next()? {
            "c" => FenceRevision::Create,
            "m" => FenceRevision::Mod,
            number => FenceRevision::At(number.parse().ok()?),
        };
        let permits = fields.next()?.parse().ok()?;
        let owner = fields.next()?.to_owned();
        Some(GrantValue {
            base,
            revision,
            permits,
            owner,
        })
    }

    /// The revision the fence of the grant in `kv` counts from.
    pub(crate) fn fence_revision(&self, kv: &KeyValue) -> i64 {
        match self.revision {
            FenceRevision::Create => kv.create_revision,
            FenceRevision::Mod => kv.mod_revision,
            FenceRevision::At(revision) => revision,
        }
    }

    /// The fence of the grant in `kv`.
    pub(crate) fn fence(&self, kv: &KeyValue) -> u64 {
        crate::fence::of(self.base, self.fence_revision(kv))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_of_a_name_sort_together_and_before_the_next_name() {
        let layout = Layout::new("/p/".into());
        let mut keys = vec![
            layout.key("a b", Slot::Lock),
            layout.key("a", Slot::Permit(10)),
            layout.key("a", Slot::Permit(2)),
            layout.key("ab", Slot::Writer),
            layout.key("a", Slot::Intent),
        ];
        keys.sort();
        let names: Vec<(String, Slot)> = keys.iter().map(|k| layout.parse(k).unwrap()).collect();
        assert_eq!(
            names,
            vec![
                ("a".into(), Slot::Intent),
                ("a".into(), Slot::Permit(2)),
                ("a".into(), Slot::Permit(10)),
                ("a b".into(), Slot::Lock),
                ("ab".into(), Slot::Writer),
            ]
        );
        for key in &keys {
            let (name, _) = layout.parse(key).unwrap();
            assert!(layout.name_start(&name) <= *key && *key < layout.name_end(&name));
        }
        assert!(layout.name_end("a") < layout.name_start("a b"));
    }

    #[test]
    fn tickets_sort_with_their_name_and_are_no_grants() {
        let layout = Layout::new("/p/".into());
        let ticket = layout.ticket("a", 0x1234);
        assert_eq!(layout.parse_ticket(&ticket), Some("a".to_owned()));
        assert_eq!(layout.parse(&ticket), None);
        assert_eq!(layout.parse_ticket(&layout.key("a", Slot::Lock)), None);
        assert_eq!(layout.parse_ticket(b"/p/g/a\0Tnothex!!"), None);
        assert!(layout.name_start("a") < ticket && ticket < layout.name_end("a"));
        assert!(layout.tickets_start("a") <= ticket && ticket < layout.tickets_end("a"));
        for slot in [
            Slot::Lock,
            Slot::Permit(0),
            Slot::Reader(99_999),
            Slot::Writer,
            Slot::Intent,
        ] {
            let key = layout.key("a", slot);
            let among_tickets = layout.tickets_start("a") <= key && key < layout.tickets_end("a");
            assert!(!among_tickets, "{slot:?} sorts among the tickets");
        }
        let value = TicketValue {
            kind: TicketKind::Read,
            owed: true,
            since_ms: 1_700_000_000_000,
            owner: "an owner:\nwith a line".into(),
        };
        assert_eq!(TicketValue::decode(&value.encode()), Some(value));
        assert_eq!(TicketValue::decode(b"alkq1\nread\n2\n0\no"), None);
        assert_eq!(
            GrantValue::decode(
                &TicketValue::decode(b"alkq1\nlock\n0\n5\no")
                    .unwrap()
                    .encode()
            ),
            None
        );
    }

    #[test]
    fn values_round_trip_and_foreign_values_are_refused() {
        for revision in [
            FenceRevision::Create,
            FenceRevision::Mod,
            FenceRevision::At(42),
        ] {
            let value = GrantValue {
                base: 7,
                revision,
                permits: 3,
                owner: "an owner: with spaces".into(),
            };
            assert_eq!(GrantValue::decode(&value.encode()), Some(value));
        }
        assert_eq!(GrantValue::decode(b"something else"), None);
        assert_eq!(GrantValue::decode(b"alk1\nx\nc\n0\nowner"), None);
    }

    #[test]
    fn a_prefix_end_is_above_every_key_of_the_prefix() {
        assert_eq!(prefix_end(b"/p/g/"), b"/p/g0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff"), vec![0]);
    }
}
