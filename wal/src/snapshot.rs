//! Snapshots: the owner's state as of an lsn, written atomically beside the segments.
//!
//! A snapshot file is `snapshot-<lsn, 20 digits>.snap`: a 32-byte header (the magic
//! `LMQSNAP1`, the lsn, the data's length, a crc32c of those and of the data) and the
//! data. It is written to a `.tmp` file, synced, renamed into place and the directory
//! synced, so a crash leaves either the old snapshot or the new one, never half of one.

use std::path::{Path, PathBuf};

use crate::storage::Storage;
use crate::{Lsn, WalError};

const MAGIC: &[u8; 8] = b"LMQSNAP1";
const HEADER: usize = 32;

/// A snapshot read back by [`latest_snapshot`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// Every record up to this lsn is in `data`; replay starts after it.
    pub lsn: Lsn,
    /// The owner's bytes.
    pub data: Vec<u8>,
    /// The file it was read from.
    pub path: PathBuf,
}

fn file_name(lsn: Lsn) -> String {
    format!("snapshot-{:020}.snap", lsn.0)
}

fn parse_name(name: &str) -> Option<Lsn> {
    let digits = name.strip_prefix("snapshot-")?.strip_suffix(".snap")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().map(Lsn)
}

/// Writes a snapshot of `data` covering the records up to `lsn` into `dir`, atomically
/// and durably, then removes older snapshots (and leftover temporary files). Call
/// [`Wal::remove_before`](crate::Wal::remove_before) with `lsn + 1` afterwards.
///
/// # Errors
///
/// [`WalError::NoSpace`] naming the temporary file when the disk has no room for it (the
/// file is removed again); [`WalError::Io`] naming the file if a step fails. The previous
/// snapshot is then still the latest.
pub fn write_snapshot(
    storage: &dyn Storage,
    dir: &Path,
    lsn: Lsn,
    data: &[u8],
) -> Result<PathBuf, WalError> {
    let path = dir.join(file_name(lsn));
    let tmp = path.with_extension("tmp");
    let mut bytes = Vec::with_capacity(HEADER + data.len());
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&lsn.0.to_le_bytes());
    bytes.extend_from_slice(&(data.len() as u64).to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&bytes[8..24]), data);
    bytes.extend_from_slice(&crc.to_le_bytes());
    bytes.extend_from_slice(&[0; 4]);
    bytes.extend_from_slice(data);
    let _ = storage.remove(&tmp); // a leftover from a crash, if any
    let file = storage
        .create(&tmp)
        .map_err(|e| WalError::io(&tmp, "create", e))?;
    if let Err(e) = file.write_at(&bytes, 0) {
        if e.kind() == std::io::ErrorKind::StorageFull {
            // Nothing depends on a snapshot not yet renamed into place: give its room
            // back, and the log keeps the records it would have covered.
            drop(file);
            let _ = storage.remove(&tmp);
            return Err(WalError::NoSpace { path: tmp });
        }
        return Err(WalError::io(&tmp, "write", e));
    }
    file.sync_data()
        .map_err(|e| WalError::io(&tmp, "fdatasync", e))?;
    storage
        .rename(&tmp, &path)
        .map_err(|e| WalError::io(&tmp, "rename", e))?;
    storage
        .sync_dir(dir)
        .map_err(|e| WalError::io(dir, "fsync directory", e))?;
    for name in storage
        .list(dir)
        .map_err(|e| WalError::io(dir, "list", e))?
    {
        let older = parse_name(&name).is_some_and(|l| l < lsn);
        let leftover = name.starts_with("snapshot-") && name.ends_with(".tmp");
        if older || leftover {
            let old = dir.join(&name);
            storage
                .remove(&old)
                .map_err(|e| WalError::io(&old, "remove", e))?;
        }
    }
    Ok(path)
}

/// The newest snapshot in `dir`, checked, or `None` if there is none (or no `dir`).
///
/// # Errors
///
/// [`WalError::Corrupt`] naming the file if the newest snapshot is damaged (it was synced
/// before it was renamed into place, so damage is not a crash's doing);
/// [`WalError::Io`] if reading fails.
pub fn latest_snapshot(storage: &dyn Storage, dir: &Path) -> Result<Option<Snapshot>, WalError> {
    let names = match storage.list(dir) {
        Ok(names) => names,
        // No directory yet: no log, and no snapshot.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(WalError::io(dir, "list", e)),
    };
    let Some(lsn) = names.iter().filter_map(|n| parse_name(n)).max() else {
        return Ok(None);
    };
    let path = dir.join(file_name(lsn));
    if lsn.0 > crate::MAX_NAMED_LSN {
        let detail = format!("a snapshot named for lsn {lsn}, which no log reaches");
        return Err(WalError::corrupt(&path, 0, detail));
    }
    let file = storage
        .open(&path)
        .map_err(|e| WalError::io(&path, "open", e))?;
    let len = file.size().map_err(|e| WalError::io(&path, "stat", e))?;
    if len < HEADER as u64 {
        return Err(WalError::corrupt(
            &path,
            0,
            "shorter than a snapshot header",
        ));
    }
    let mut bytes = vec![0; len as usize];
    file.read_at(&mut bytes, 0)
        .map_err(|e| WalError::io(&path, "read", e))?;
    let field = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    if &bytes[..8] != MAGIC {
        return Err(WalError::corrupt(&path, 0, "not a snapshot (bad magic)"));
    }
    if field(8) != lsn.0 {
        return Err(WalError::corrupt(
            &path,
            8,
            format!("holds lsn {} but is named for {lsn}", field(8)),
        ));
    }
    if field(16) != len - HEADER as u64 {
        return Err(WalError::corrupt(
            &path,
            16,
            format!(
                "says {} bytes of data, has {}",
                field(16),
                len - HEADER as u64
            ),
        ));
    }
    let crc = u32::from_le_bytes(bytes[24..28].try_into().expect("4 bytes"));
    let actual = crc32c::crc32c_append(crc32c::crc32c(&bytes[8..24]), &bytes[HEADER..]);
    if crc != actual {
        return Err(WalError::corrupt(
            &path,
            24,
            format!("crc32c {actual:#010x} where the header says {crc:#010x}"),
        ));
    }
    bytes.drain(..HEADER);
    Ok(Some(Snapshot {
        lsn,
        data: bytes,
        path,
    }))
}
