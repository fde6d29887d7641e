//! The log's identity: a random number drawn when the log is made, kept in `wal.id` beside
//! the segments, and folded with each segment's first lsn into the crc of every frame.
//!
//! A frame is then valid only in the segment of the log that wrote it. The bytes of a
//! record that hold a frame image (a message body stored in the log, a record of another
//! log, a recycled segment's last use) never check out as a frame of this one, so recovery
//! cannot take them for a record, or for a later write that would make a torn tail look
//! like corruption. The identity is not secret from the machine, only from what clients
//! put in records.
//!
//! `wal.id` is 32 bytes: the magic `LMQWALID`, the format version (u32), four zero bytes,
//! the identity (u64), a crc32c of the 24 bytes before it, and four zero bytes. It is
//! written to a `.tmp` file, synced, renamed into place and the directory synced before
//! the log's first segment is created. A log found with segments and no `wal.id` was made
//! by the first format, whose frames' crcs cover their own bytes only: it is read as such
//! (identity 0).

use std::hash::BuildHasher;
use std::path::Path;

use crate::storage::{read_small, write_small, Storage};
use crate::WalError;

/// The file that holds a log's identity.
pub(crate) const FILE: &str = "wal.id";
const MAGIC: &[u8; 8] = b"LMQWALID";
/// The format of a log with an identity: frames' crcs are seeded with it.
pub(crate) const FORMAT: u32 = 2;
const LEN: usize = 32;

/// The identity of the log in `dir`: `None` if it has no `wal.id`.
pub(crate) fn read(storage: &dyn Storage, dir: &Path) -> Result<Option<u64>, WalError> {
    let names = storage
        .list(dir)
        .map_err(|e| WalError::io(dir, "list", e))?;
    let Some(bytes) = read_small(storage, dir, &names, FILE, LEN, "a log identity")? else {
        return Ok(None);
    };
    let path = dir.join(FILE);
    if &bytes[..8] != MAGIC {
        return Err(WalError::corrupt(
            &path,
            0,
            "not a log identity (bad magic)",
        ));
    }
    let crc = u32::from_le_bytes(bytes[24..28].try_into().expect("4 bytes"));
    let actual = crc32c::crc32c(&bytes[..24]);
    if crc != actual {
        let detail = format!("crc32c {actual:#010x} where the file says {crc:#010x}");
        return Err(WalError::corrupt(&path, 24, detail));
    }
    let format = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
    if format != FORMAT {
        let detail = format!("log format {format}; this build reads format {FORMAT}");
        return Err(WalError::corrupt(&path, 8, detail));
    }
    let id = u64::from_le_bytes(bytes[16..24].try_into().expect("8 bytes"));
    if id == 0 {
        return Err(WalError::corrupt(&path, 16, "a log identity of 0"));
    }
    Ok(Some(id))
}

/// Writes `id` as the identity of the log in `dir`, durably.
pub(crate) fn write(storage: &dyn Storage, dir: &Path, id: u64) -> Result<(), WalError> {
    let mut bytes = Vec::with_capacity(LEN);
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&FORMAT.to_le_bytes());
    bytes.extend_from_slice(&[0; 4]);
    bytes.extend_from_slice(&id.to_le_bytes());
    bytes.extend_from_slice(&crc32c::crc32c(&bytes).to_le_bytes());
    bytes.extend_from_slice(&[0; 4]);
    write_small(storage, dir, FILE, &bytes).map_err(|e| WalError::io(dir.join(FILE), "write", e))
}

/// A new identity: random (the standard library's hasher keys come from the operating
/// system's randomness), mixed with the time and the process, and never 0.
pub(crate) fn fresh(dir: &Path) -> u64 {
    let state = std::collections::hash_map::RandomState::new();
    let drawn = (std::time::SystemTime::now(), std::process::id(), dir);
    state.hash_one(drawn).max(1)
}
