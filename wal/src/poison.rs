//! The poison marker: what a log whose fsync failed leaves for its next opening.
//!
//! After a failed `fdatasync` the kernel may already have marked the unwritten pages
//! clean (PostgreSQL's "fsyncgate"): a process that reopens the log without a reboot reads
//! records from the page cache that never reached the disk, a later `fdatasync` does not
//! write them, and a power loss then leaves a hole under records that are on the disk.
//! So when a round's write or fsync fails, the syncer writes `wal.poisoned`, holding the
//! last lsn that was durable, and recovery cuts every record after it as never written,
//! then removes the marker. A marker the failing disk refuses is not written: the log then
//! reopens as it reads, as before.
//!
//! `wal.poisoned` is 24 bytes: the magic `LMQPOISN`, the lsn (u64), a crc32c of the lsn,
//! and four zero bytes; written to a `.tmp` file, synced, renamed and the directory synced.

use std::path::Path;

use crate::storage::{read_small, write_small, Storage};
use crate::WalError;

/// The file that marks a log poisoned.
pub(crate) const FILE: &str = "wal.poisoned";
const MAGIC: &[u8; 8] = b"LMQPOISN";
const LEN: usize = 24;

/// The last durable lsn a poison marker in `dir` holds, or `None` if there is none.
pub(crate) fn read(
    storage: &dyn Storage,
    dir: &Path,
    names: &[String],
) -> Result<Option<u64>, WalError> {
    let Some(bytes) = read_small(storage, dir, names, FILE, LEN, "a poison marker")? else {
        return Ok(None);
    };
    let crc = u32::from_le_bytes(bytes[16..20].try_into().expect("4 bytes"));
    if &bytes[..8] != MAGIC || crc != crc32c::crc32c(&bytes[8..16]) {
        return Err(WalError::corrupt(
            dir.join(FILE),
            0,
            "a damaged poison marker",
        ));
    }
    Ok(Some(u64::from_le_bytes(
        bytes[8..16].try_into().expect("8 bytes"),
    )))
}

/// Marks the log in `dir` poisoned, with `durable` its last durable lsn.
pub(crate) fn write(storage: &dyn Storage, dir: &Path, durable: u64) -> std::io::Result<()> {
    let mut bytes = Vec::with_capacity(LEN);
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&durable.to_le_bytes());
    bytes.extend_from_slice(&crc32c::crc32c(&durable.to_le_bytes()).to_le_bytes());
    bytes.extend_from_slice(&[0; 4]);
    write_small(storage, dir, FILE, &bytes)
}

/// Removes the marker once what it asked for is done and durable.
pub(crate) fn remove(storage: &dyn Storage, dir: &Path) -> Result<(), WalError> {
    let path = dir.join(FILE);
    storage
        .remove(&path)
        .map_err(|e| WalError::io(&path, "remove", e))?;
    storage
        .sync_dir(dir)
        .map_err(|e| WalError::io(dir, "fsync directory", e))
}
