//! How an entry is kept in the log: one record per entry.
//!
//! ```text
//! 0       u8   format (1)
//! 1       u8   kind: 0 blank, 1 a batch, 2 a membership
//! 2..10   u64  term of the leader that wrote the entry
//! 10..18  u64  that leader's node id
//! 18..26  u64  index (the record's lsn - 1, checked when read)
//! kind 1: u32 inc, u64 p, then the batch's change records
//! kind 2: the membership, as JSON (rare, small, and readable in a hex dump)
//! ```
//!
//! Integers are little-endian, as everywhere in the log.

use openraft::entry::RaftEntry;
use openraft::EntryPayload;

use crate::{invalid, Batch, Entry, LogId, Membership};

const FORMAT: u8 = 1;
pub(crate) const HEADER: usize = 26;
const BLANK: u8 = 0;
const NORMAL: u8 = 1;
const MEMBERSHIP: u8 = 2;

/// Appends `entry`'s record to `out`.
///
/// # Errors
///
/// A membership that does not encode (it always does: JSON of ids and addresses).
pub fn encode_entry(entry: &Entry, out: &mut Vec<u8>) -> std::io::Result<()> {
    let kind = match &entry.payload {
        EntryPayload::Blank => BLANK,
        EntryPayload::Normal(_) => NORMAL,
        EntryPayload::Membership(_) => MEMBERSHIP,
    };
    let leader = entry.log_id.committed_leader_id();
    out.push(FORMAT);
    out.push(kind);
    out.extend_from_slice(&leader.term.to_le_bytes());
    out.extend_from_slice(&leader.node_id.to_le_bytes());
    out.extend_from_slice(&entry.log_id.index.to_le_bytes());
    match &entry.payload {
        EntryPayload::Blank => {}
        EntryPayload::Normal(batch) => {
            out.extend_from_slice(&batch.inc.to_le_bytes());
            out.extend_from_slice(&batch.p.to_le_bytes());
            out.extend_from_slice(&batch.changes);
        }
        EntryPayload::Membership(membership) => {
            serde_json::to_writer(&mut *out, membership).map_err(std::io::Error::other)?;
        }
    }
    Ok(())
}

/// The log id of the entry a record holds, read from its header alone; `index` is the
/// one its lsn says it has.
///
/// # Errors
///
/// As [`decode_entry`], for the header.
pub(crate) fn entry_log_id(record: &[u8], index: u64) -> std::io::Result<LogId> {
    check_header(record, index)?;
    let u64_at = |at: usize| u64::from_le_bytes(record[at..at + 8].try_into().expect("8 bytes"));
    Ok(crate::log_id(u64_at(2), u64_at(10), index))
}

fn check_header(record: &[u8], index: u64) -> std::io::Result<()> {
    if record.len() < HEADER {
        return Err(invalid(format!(
            "entry {index}: {} bytes, shorter than an entry header",
            record.len()
        )));
    }
    if record[0] != FORMAT {
        return Err(invalid(format!(
            "entry {index}: unknown format {}",
            record[0]
        )));
    }
    let stored = u64::from_le_bytes(record[18..26].try_into().expect("8 bytes"));
    if stored != index {
        return Err(invalid(format!("entry {index}: holds index {stored}")));
    }
    Ok(())
}

/// The entry a record holds; `index` is the one its lsn says it has.
///
/// # Errors
///
/// `InvalidData` saying what is wrong: an unknown format or kind, a record too short,
/// an index other than `index`, a membership that does not decode.
pub fn decode_entry(record: &[u8], index: u64) -> std::io::Result<Entry> {
    let log_id = entry_log_id(record, index)?;
    let body = &record[HEADER..];
    match record[1] {
        BLANK if body.is_empty() => Ok(Entry::new_blank(log_id)),
        NORMAL if body.len() >= 12 => {
            let inc = u32::from_le_bytes(body[..4].try_into().expect("4 bytes"));
            let p = u64::from_le_bytes(body[4..12].try_into().expect("8 bytes"));
            let changes = body[12..].to_vec();
            Ok(Entry::new_normal(log_id, Batch { inc, p, changes }))
        }
        MEMBERSHIP => {
            let membership: Membership = serde_json::from_slice(body)
                .map_err(|e| invalid(format!("entry {index}: membership: {e}")))?;
            Ok(Entry::new_membership(log_id, membership))
        }
        kind => Err(invalid(format!(
            "entry {index}: kind {kind} with {} bytes of body",
            body.len()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;

    use crate::log_id;

    fn round_trip(entry: Entry) {
        let mut bytes = Vec::new();
        encode_entry(&entry, &mut bytes).unwrap();
        let back = decode_entry(&bytes, entry.log_id.index).unwrap();
        assert_eq!(back, entry);
    }

    #[test]
    fn every_kind_of_entry_reads_back_as_it_was_written() {
        round_trip(Entry::new_blank(log_id(3, 2, 17)));
        let batch = Batch {
            inc: 4,
            p: u64::MAX,
            changes: b"change records".to_vec(),
        };
        round_trip(Entry::new_normal(log_id(u64::MAX, 7, 0), batch));
        round_trip(Entry::new_normal(log_id(1, 1, 1), Batch::default()));
        let nodes = BTreeMap::from([
            (1, openraft::BasicNode::new("10.0.0.1:5679")),
            (2, openraft::BasicNode::new("10.0.0.2:5679")),
        ]);
        let voters = vec![BTreeSet::from([1, 2])];
        let membership = Membership::new(voters, nodes).unwrap();
        round_trip(Entry::new_membership(log_id(1, 1, 0), membership));
    }

    #[test]
    fn a_record_at_another_index_or_cut_short_is_refused() {
        let mut bytes = Vec::new();
        let batch = Batch {
            inc: 1,
            p: 2,
            changes: vec![9; 40],
        };
        encode_entry(&Entry::new_normal(log_id(2, 1, 5), batch), &mut bytes).unwrap();
        let err = decode_entry(&bytes, 6).unwrap_err();
        assert!(err.to_string().contains("holds index 5"), "{err}");
        for len in [0, 1, 25, 26, 37] {
            assert!(decode_entry(&bytes[..len], 5).is_err(), "{len} bytes");
        }
        let mut odd = bytes.clone();
        odd[0] = 2;
        assert!(decode_entry(&odd, 5).is_err());
        odd = bytes.clone();
        odd[1] = 3;
        assert!(decode_entry(&odd, 5).is_err());
    }
}
