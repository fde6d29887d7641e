//! The storage the log runs on: two small traits, and [`DiskStorage`] over real files.
//!
//! Everything the log does to a disk goes through [`Storage`] and [`StorageFile`], so the
//! same log runs on [`MemDisk`](crate::MemDisk), the fake disk its crash tests (and later
//! the simulator) use to lose unsynced writes, tear sectors and flip bits.

use std::any::Any;
use std::fmt::Debug;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::Path;

/// A held directory lock; dropping it releases the lock.
pub type DirLock = Box<dyn Any + Send + Sync>;

/// A file system, as far as the log needs one.
///
/// Directory operations (`create`, `rename`, `remove`) are durable only once
/// [`sync_dir`](Storage::sync_dir) of their directory returned.
pub trait Storage: Send + Sync + Debug {
    /// Creates `dir` and its parents where missing. Like any directory operation, a new
    /// directory is durable only once `sync_dir` of its parent returned (see
    /// [`create_dir_durable`]).
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// Takes the exclusive lock of `dir`. A lock already held, by this or another process,
    /// is an error of kind [`io::ErrorKind::WouldBlock`].
    fn lock(&self, dir: &Path) -> io::Result<DirLock>;
    /// The names of the files in `dir` (not their paths), in no particular order.
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// Creates a new, empty file, opened for reading and writing; an error if it exists.
    fn create(&self, path: &Path) -> io::Result<Box<dyn StorageFile>>;
    /// Opens an existing file for reading and writing.
    fn open(&self, path: &Path) -> io::Result<Box<dyn StorageFile>>;
    /// Removes a file.
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Renames a file, replacing `to` if it exists.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Makes the directory's entries durable (fsync of the directory).
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
}

/// Creates `dir` and its parents where missing, and makes each directory it creates
/// durable in its parent (an fsync of the parent): until then a crash can lose the new
/// directory, with everything synced into it.
///
/// # Errors
///
/// What the storage answers to listing, creating or syncing a directory.
pub fn create_dir_durable(storage: &dyn Storage, dir: &Path) -> io::Result<()> {
    // A relative path's last parent is empty: the working directory.
    fn parent_of(path: &Path) -> Option<&Path> {
        let parent = path.parent()?;
        Some(if parent.as_os_str().is_empty() {
            Path::new(".")
        } else {
            parent
        })
    }
    let mut missing = Vec::new();
    let mut at = Some(dir);
    while let Some(path) = at.filter(|p| !p.as_os_str().is_empty()) {
        match storage.list(path) {
            Ok(_) => break,
            Err(e) if e.kind() == io::ErrorKind::NotFound => missing.push(path),
            Err(e) => return Err(e),
        }
        at = path.parent();
    }
    storage.create_dir_all(dir)?;
    for path in missing.iter().rev() {
        if let Some(parent) = parent_of(path) {
            storage.sync_dir(parent)?;
        }
    }
    Ok(())
}

/// Reads the small file `name` of `dir` whole, which must be `len` bytes (what it holds
/// is told by `what`, for the error); `None` if `names`, the files of `dir`, lack it.
pub(crate) fn read_small(
    storage: &dyn Storage,
    dir: &Path,
    names: &[String],
    name: &str,
    len: usize,
    what: &str,
) -> Result<Option<Vec<u8>>, crate::WalError> {
    use crate::WalError;
    if !names.iter().any(|n| n == name) {
        return Ok(None);
    }
    let path = dir.join(name);
    let file = storage
        .open(&path)
        .map_err(|e| WalError::io(&path, "open", e))?;
    let size = file.size().map_err(|e| WalError::io(&path, "stat", e))?;
    if size != len as u64 {
        let detail = format!("{size} bytes where {what} has {len}");
        return Err(WalError::corrupt(&path, 0, detail));
    }
    let mut bytes = vec![0; len];
    file.read_at(&mut bytes, 0)
        .map_err(|e| WalError::io(&path, "read", e))?;
    Ok(Some(bytes))
}

/// Writes `bytes` as the file `name` of `dir`, atomically and durably: to a temporary
/// file first, synced, renamed into place, and the directory synced. A crash leaves the
/// old file (or none) or the new one, never part of one.
pub(crate) fn write_small(
    storage: &dyn Storage,
    dir: &Path,
    name: &str,
    bytes: &[u8],
) -> io::Result<()> {
    let path = dir.join(name);
    let tmp = dir.join(format!("{name}.tmp"));
    let _ = storage.remove(&tmp); // a leftover from a crash, if any
    let file = storage.create(&tmp)?;
    file.write_at(bytes, 0)?;
    file.sync_data()?;
    storage.rename(&tmp, &path)?;
    storage.sync_dir(dir)
}

/// An open file.
pub trait StorageFile: Send + Sync + Debug {
    /// The file's length in bytes.
    fn size(&self) -> io::Result<u64>;
    /// Fills `buf` from `offset`; reading past the end is an error.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes all of `buf` at `offset`.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Extends the file to `len` bytes of zeros, reserving the space, so that later writes
    /// below `len` cannot fail for want of it; a file already as long is left as it is.
    /// A full disk is an error of kind [`io::ErrorKind::StorageFull`].
    fn allocate(&self, len: u64) -> io::Result<()>;
    /// Makes the file's data (and the metadata needed to read it) durable: `fdatasync`.
    fn sync_data(&self) -> io::Result<()>;
}

/// The real file system, through `std::fs` (Unix: positioned reads and writes, `flock`
/// for the directory lock, and on Linux `fallocate`).
#[derive(Clone, Copy, Debug, Default)]
pub struct DiskStorage;

/// The file [`DiskStorage`] takes its locks on, in the locked directory.
pub const LOCK_FILE: &str = "LOCK";

#[derive(Debug)]
struct DiskFile(File);

impl Storage for DiskStorage {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        fs::create_dir_all(dir)
    }

    fn lock(&self, dir: &Path) -> io::Result<DirLock> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.join(LOCK_FILE))?;
        lock_exclusive(&file)?;
        Ok(Box::new(file))
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in fs::read_dir(dir)? {
            if let Ok(name) = entry?.file_name().into_string() {
                names.push(name);
            }
        }
        Ok(names)
    }

    fn create(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)?;
        Ok(Box::new(DiskFile(file)))
    }

    fn open(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        Ok(Box::new(DiskFile(file)))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }
}

#[cfg(unix)]
impl StorageFile for DiskFile {
    fn size(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(&self.0, buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(&self.0, buf, offset)
    }

    fn allocate(&self, len: u64) -> io::Result<()> {
        let old = self.size()?;
        if old >= len {
            return Ok(());
        }
        match preallocate(&self.0, old, len - old) {
            Err(e) if e.kind() == io::ErrorKind::Unsupported => self.write_zeros(old, len),
            other => other,
        }
    }

    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }
}

impl DiskFile {
    /// Extends the file by writing zeros: where `fallocate` is not available.
    fn write_zeros(&self, from: u64, to: u64) -> io::Result<()> {
        let zeros = vec![0u8; 1 << 20];
        let mut at = from;
        while at < to {
            let n = (to - at).min(zeros.len() as u64);
            self.write_at(&zeros[..n as usize], at)?;
            at += n;
        }
        Ok(())
    }
}

/// `flock(LOCK_EX | LOCK_NB)` on the lock file: held while the file is open, released by
/// the kernel when the process dies, so a crash leaves no stale lock. (`File::try_lock`
/// does the same from Rust 1.89; the workspace still builds with 1.85.)
#[cfg(unix)]
fn lock_exclusive(file: &File) -> io::Result<()> {
    use rustix::fs::{flock, FlockOperation};
    flock(file, FlockOperation::NonBlockingLockExclusive).map_err(io::Error::from)
}

/// `fallocate(2)`: reserves the blocks and extends the file in one metadata operation,
/// without writing the zeros, so a new segment costs no data IO; a full disk shows here
/// rather than in a later write.
#[cfg(target_os = "linux")]
fn preallocate(file: &File, offset: u64, len: u64) -> io::Result<()> {
    use rustix::fs::{fallocate, FallocateFlags};
    match fallocate(file, FallocateFlags::empty(), offset, len) {
        Err(e) if e == rustix::io::Errno::OPNOTSUPP => Err(io::ErrorKind::Unsupported.into()),
        other => other.map_err(io::Error::from),
    }
}

#[cfg(not(target_os = "linux"))]
fn preallocate(_: &File, _: u64, _: u64) -> io::Result<()> {
    Err(io::ErrorKind::Unsupported.into())
}
