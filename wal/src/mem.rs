//! [`MemDisk`]: an in-memory disk that models what survives a crash.
//!
//! Each file keeps two images: what the process sees, and what is durable (as of the last
//! `sync_data`). Directory entries likewise, of files and of directories: what the process
//! sees, and what the last `sync_dir` of each directory made durable. A directory whose
//! own entry was not made durable in its parent is lost at a crash with all it holds. [`MemDisk::crash`] returns a new disk built
//! from the durable state plus, depending on [`Crash`], some of what was not synced: every
//! unsynced 512-byte sector is kept or lost independently (so a write can be torn at any
//! sector, in any pattern), and each unsynced directory operation (a create, a remove, a
//! rename, a new directory) is kept or lost on its own, those kept applied in order, a
//! rename whole. The crashed disk fails every later call, so a log still running on it is
//! poisoned rather than writing into the new one.
//!
//! Tests also use its hooks: flip a bit in durable data, count data syncs, hold syncs
//! at a gate (to see what a second fsync carries), fail the next sync, remove or read,
//! fill the disk.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::storage::{DirLock, Storage, StorageFile};

/// The unit a crash keeps or loses whole.
pub const SECTOR: u64 = 512;

/// A shared handle to one in-memory disk; clones see the same disk.
#[derive(Clone, Debug, Default)]
pub struct MemDisk {
    inner: Arc<Inner>,
}

/// What a [`MemDisk::crash`] does with data and directory entries that were not synced.
#[derive(Clone, Copy, Debug)]
pub enum Crash {
    /// Everything written survives (the process died, the machine did not).
    KeepUnsynced,
    /// Nothing unsynced survives.
    LoseUnsynced,
    /// A seeded choice: file lengths and directory operations kept or lost, and either a
    /// random prefix of each file's unsynced sectors or a random subset of them kept.
    Tear {
        /// Seeds the choices; the same seed on the same disk makes the same image.
        seed: u64,
    },
}

#[derive(Debug, Default)]
struct Inner {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct State {
    crashed: bool,
    inodes: HashMap<u64, Inode>,
    next_inode: u64,
    names: BTreeMap<PathBuf, u64>,
    durable_names: BTreeMap<PathBuf, u64>,
    /// Directories (the root is always there), and those whose entry in their parent
    /// was synced.
    dirs: BTreeSet<PathBuf>,
    durable_dirs: BTreeSet<PathBuf>,
    /// The directory operations since the last sync of their directories, in order: what
    /// turns `durable_names` and `durable_dirs` into `names` and `dirs`.
    dir_ops: Vec<DirOp>,
    locks: BTreeSet<PathBuf>,
    capacity: Option<u64>,
    data_syncs: u64,
    hold_syncs: bool,
    held: usize,
    /// Removals of files whose names end so wait at a gate.
    hold_removes: Option<String>,
    held_removes: usize,
    fail_next_sync: bool,
    fail_next_remove: bool,
    /// The file whose next read fails.
    fail_read: Option<u64>,
    /// Writes need room even inside a file's length (`copy_on_write`).
    cow: bool,
    /// A crash garbles the unsynced sectors it does not keep (see `garble_torn_sectors`).
    garble: bool,
}

/// A directory operation not yet made durable by a sync of its directory.
#[derive(Clone, Debug)]
enum DirOp {
    Create(PathBuf, u64),
    Remove(PathBuf),
    Rename(PathBuf, PathBuf),
    MakeDir(PathBuf),
}

impl DirOp {
    /// Whether a sync of `dir` makes it durable: every entry it changes lies in `dir`.
    fn lies_in(&self, dir: &Path) -> bool {
        match self {
            DirOp::Create(p, _) | DirOp::Remove(p) | DirOp::MakeDir(p) => p.parent() == Some(dir),
            DirOp::Rename(from, to) => from.parent() == Some(dir) && to.parent() == Some(dir),
        }
    }

    /// Applies it to a crash image's entries, as far as they allow (what it needs may
    /// have been lost).
    fn apply(&self, names: &mut BTreeMap<PathBuf, u64>, dirs: &mut BTreeSet<PathBuf>) {
        match self {
            DirOp::Create(path, ino) => {
                names.insert(path.clone(), *ino);
            }
            DirOp::Remove(path) => {
                names.remove(path);
            }
            DirOp::Rename(from, to) => {
                if let Some(ino) = names.remove(from) {
                    names.insert(to.clone(), ino);
                }
            }
            DirOp::MakeDir(path) => {
                dirs.insert(path.clone());
            }
        }
    }
}

#[derive(Clone, Debug, Default)]
struct Inode {
    data: Vec<u8>,
    durable: Vec<u8>,
    dirty: BTreeSet<u64>,
}

impl MemDisk {
    /// An empty disk with no size limit.
    pub fn new() -> MemDisk {
        MemDisk::default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().expect("mem disk lock")
    }

    /// The disk after a crash now: a new disk holding what survived (see [`Crash`]). This
    /// disk fails every later call, and its directory locks are gone with the process.
    pub fn crash(&self, mode: Crash) -> MemDisk {
        let mut state = self.state();
        state.crashed = true;
        self.inner.changed.notify_all();
        let mut rng = fastrand::Rng::with_seed(match mode {
            Crash::Tear { seed } => seed,
            _ => 0,
        });
        let (mut names, mut dirs) = match mode {
            Crash::KeepUnsynced => (state.names.clone(), state.dirs.clone()),
            Crash::LoseUnsynced => (state.durable_names.clone(), state.durable_dirs.clone()),
            Crash::Tear { .. } => {
                let mut names = state.durable_names.clone();
                let mut dirs = state.durable_dirs.clone();
                for op in state.dir_ops.iter().filter(|_| rng.bool()) {
                    op.apply(&mut names, &mut dirs);
                }
                (names, dirs)
            }
        };
        // What lies in a directory whose own entry was lost is lost with it.
        let reachable = |path: &Path, dirs: &BTreeSet<PathBuf>| {
            path.ancestors()
                .skip(1)
                .all(|a| is_root(a) || dirs.contains(a))
        };
        let kept = dirs.clone();
        dirs.retain(|d| reachable(d, &kept));
        names.retain(|p, _| reachable(p, &dirs));
        let mut inodes = HashMap::new();
        for &ino in names.values() {
            let inode = &state.inodes[&ino];
            let image = match mode {
                Crash::KeepUnsynced => inode.data.clone(),
                Crash::LoseUnsynced => inode.durable.clone(),
                Crash::Tear { .. } => inode.torn(&mut rng, state.garble),
            };
            inodes.insert(
                ino,
                Inode {
                    data: image.clone(),
                    durable: image,
                    dirty: BTreeSet::new(),
                },
            );
        }
        MemDisk::from_state(State {
            inodes,
            next_inode: state.next_inode,
            durable_names: names.clone(),
            names,
            durable_dirs: dirs.clone(),
            dirs,
            capacity: state.capacity,
            ..State::default()
        })
    }

    fn from_state(state: State) -> MemDisk {
        MemDisk {
            inner: Arc::new(Inner {
                state: Mutex::new(state),
                changed: Condvar::new(),
            }),
        }
    }

    /// A copy of this disk as it is now, everything in it durable: for trying several
    /// damages on the same image.
    pub fn fork(&self) -> MemDisk {
        let state = self.state();
        let inodes = state
            .names
            .values()
            .map(|&ino| {
                let data = state.inodes[&ino].data.clone();
                let inode = Inode {
                    durable: data.clone(),
                    data,
                    dirty: BTreeSet::new(),
                };
                (ino, inode)
            })
            .collect();
        MemDisk::from_state(State {
            inodes,
            next_inode: state.next_inode,
            names: state.names.clone(),
            durable_names: state.names.clone(),
            dirs: state.dirs.clone(),
            durable_dirs: state.dirs.clone(),
            capacity: state.capacity,
            ..State::default()
        })
    }

    /// The contents of a file, or `None` if there is none by that name.
    pub fn contents(&self, path: &Path) -> Option<Vec<u8>> {
        let state = self.state();
        let ino = state.names.get(path)?;
        Some(state.inodes[ino].data.clone())
    }

    /// Overwrites bytes of a file, durably, as damage would: no sync needed. Panics if the
    /// file does not exist or is shorter.
    pub fn damage(&self, path: &Path, offset: u64, bytes: &[u8]) {
        let mut state = self.state();
        let ino = state.names[path];
        let inode = state.inodes.get_mut(&ino).expect("inode");
        let range = offset as usize..offset as usize + bytes.len();
        inode.data[range.clone()].copy_from_slice(bytes);
        inode.durable[range].copy_from_slice(bytes);
    }

    /// Flips one bit of a file, durably.
    pub fn flip_bit(&self, path: &Path, offset: u64, bit: u8) {
        let byte = self.contents(path).expect("file")[offset as usize];
        self.damage(path, offset, &[byte ^ (1 << bit)]);
    }

    /// How many `sync_data` calls have succeeded on this disk.
    pub fn data_syncs(&self) -> u64 {
        self.state().data_syncs
    }

    /// Makes every later `sync_data` wait at a gate until [`release_syncs`](Self::release_syncs).
    pub fn hold_syncs(&self) {
        self.state().hold_syncs = true;
    }

    /// Opens the gate of [`hold_syncs`](Self::hold_syncs).
    pub fn release_syncs(&self) {
        self.state().hold_syncs = false;
        self.inner.changed.notify_all();
    }

    /// Blocks until a `sync_data` waits at the gate.
    pub fn wait_for_held_sync(&self) {
        let mut state = self.state();
        while state.held == 0 {
            state = self.inner.changed.wait(state).expect("mem disk lock");
        }
    }

    /// Makes every later `remove` of a file whose name ends with `suffix` wait at a gate
    /// until [`release_removes`](Self::release_removes): a slow unlink.
    pub fn hold_removes(&self, suffix: &str) {
        self.state().hold_removes = Some(suffix.to_string());
    }

    /// Opens the gate of [`hold_removes`](Self::hold_removes).
    pub fn release_removes(&self) {
        self.state().hold_removes = None;
        self.inner.changed.notify_all();
    }

    /// Blocks until a `remove` waits at the gate.
    pub fn wait_for_held_remove(&self) {
        let mut state = self.state();
        while state.held_removes == 0 {
            state = self.inner.changed.wait(state).expect("mem disk lock");
        }
    }

    /// Makes the next `sync_data` fail with an IO error, as a failing device would. Its
    /// unsynced writes are then dropped as Linux drops them: the process still reads them,
    /// but they are not written by a later sync and a crash loses them.
    pub fn fail_next_sync(&self) {
        self.state().fail_next_sync = true;
    }

    /// Makes writes need free space even inside a file's preallocated length, as on a
    /// copy-on-write file system, which writes new blocks and frees the old ones after:
    /// on a full disk, such a write fails with [`io::ErrorKind::StorageFull`].
    pub fn copy_on_write(&self) {
        self.state().cow = true;
    }

    /// The bytes all files hold together.
    pub fn used(&self) -> u64 {
        self.state().used()
    }

    /// Makes the next `remove` fail with an IO error, the file left in place.
    pub fn fail_next_remove(&self) {
        self.state().fail_next_remove = true;
    }

    /// Makes the next `read_at` of the file at `path` fail with an IO error, as a sector
    /// the device cannot read would. Panics if there is no such file.
    pub fn fail_next_read(&self, path: &Path) {
        let mut state = self.state();
        state.fail_read = Some(state.names[path]);
    }

    /// Makes a [`Crash::Tear`] garble every unsynced sector it does not keep, as a device
    /// whose sector writes are not atomic may leave a sector it was writing at a power
    /// loss: neither its old bytes nor its new ones. A sector a write rewrote is then lost
    /// whole, whatever it held before.
    pub fn garble_torn_sectors(&self) {
        self.state().garble = true;
    }

    /// Limits the bytes all files may hold together; `None` for no limit.
    pub fn set_capacity(&self, bytes: Option<u64>) {
        self.state().capacity = bytes;
    }

    fn check(state: &State) -> io::Result<()> {
        if state.crashed {
            Err(io::Error::other("the disk crashed"))
        } else {
            Ok(())
        }
    }
}

/// Whether `path` is the root of the file system (or of relative paths).
fn is_root(path: &Path) -> bool {
    path.parent().is_none() || path.as_os_str().is_empty()
}

impl State {
    fn is_dir(&self, path: &Path) -> bool {
        is_root(path) || self.dirs.contains(path)
    }

    /// An error of kind `NotFound` unless `path`'s directory exists.
    fn check_parent(&self, path: &Path) -> io::Result<()> {
        match path.parent() {
            Some(dir) if !self.is_dir(dir) => Err(io::ErrorKind::NotFound.into()),
            _ => Ok(()),
        }
    }

    fn used(&self) -> u64 {
        self.names
            .values()
            .map(|ino| self.inodes[ino].data.len() as u64)
            .sum()
    }

    /// Checks that a file may grow from `old` to `new` bytes.
    fn reserve(&self, old: u64, new: u64) -> io::Result<()> {
        match self.capacity {
            Some(cap) if new > old && self.used() + (new - old) > cap => {
                Err(io::ErrorKind::StorageFull.into())
            }
            _ => Ok(()),
        }
    }

    fn inode(&mut self, ino: u64) -> &mut Inode {
        self.inodes.get_mut(&ino).expect("open file's inode")
    }
}

impl Inode {
    fn sync(&mut self) {
        self.durable.resize(self.data.len(), 0);
        for &sector in &self.dirty {
            let range = sector_range(sector, self.data.len());
            self.durable[range.clone()].copy_from_slice(&self.data[range]);
        }
        self.dirty.clear();
    }

    /// A crash image: the durable data, the length change kept or not, and some of the
    /// unsynced sectors; with `garble`, those not kept read as garbage.
    fn torn(&self, rng: &mut fastrand::Rng, garble: bool) -> Vec<u8> {
        let len = if rng.bool() {
            self.data.len()
        } else {
            self.durable.len()
        };
        let mut image = self.durable.clone();
        image.resize(len, 0);
        let dirty: Vec<u64> = self.dirty.iter().copied().collect();
        let prefix = rng.usize(..=dirty.len());
        let holes = rng.bool();
        for (i, &sector) in dirty.iter().enumerate() {
            let keep = if holes { rng.bool() } else { i < prefix };
            let range = sector_range(sector, self.data.len());
            if keep {
                if image.len() < range.end {
                    image.resize(range.end, 0);
                }
                image[range.clone()].copy_from_slice(&self.data[range]);
            } else if garble {
                let end = range.end.min(image.len());
                for byte in &mut image[range.start.min(end)..end] {
                    *byte = rng.u8(..);
                }
            }
        }
        image
    }
}

fn sector_range(sector: u64, len: usize) -> std::ops::Range<usize> {
    let start = (sector * SECTOR) as usize;
    start.min(len)..((sector + 1) * SECTOR).min(len as u64) as usize
}

#[derive(Debug)]
struct MemFile {
    disk: MemDisk,
    ino: u64,
}

#[derive(Debug)]
struct MemLock {
    disk: MemDisk,
    dir: PathBuf,
}

impl Drop for MemLock {
    fn drop(&mut self) {
        self.disk.state().locks.remove(&self.dir);
    }
}

impl Storage for MemDisk {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut state = self.state();
        MemDisk::check(&state)?;
        for ancestor in dir.ancestors().filter(|a| !is_root(a)) {
            if state.names.contains_key(ancestor) {
                return Err(io::Error::other("a file where a directory should be"));
            }
        }
        // Outermost first, as `mkdir -p` makes them.
        let ancestors: Vec<&Path> = dir.ancestors().filter(|a| !is_root(a)).collect();
        for ancestor in ancestors.into_iter().rev() {
            if state.dirs.insert(ancestor.to_path_buf()) {
                state.dir_ops.push(DirOp::MakeDir(ancestor.to_path_buf()));
            }
        }
        Ok(())
    }

    fn lock(&self, dir: &Path) -> io::Result<DirLock> {
        let mut state = self.state();
        MemDisk::check(&state)?;
        if !state.locks.insert(dir.to_path_buf()) {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(Box::new(MemLock {
            disk: self.clone(),
            dir: dir.to_path_buf(),
        }))
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let state = self.state();
        MemDisk::check(&state)?;
        if !state.is_dir(dir) {
            return Err(io::ErrorKind::NotFound.into());
        }
        // Files and directories, as a directory listing has them.
        Ok((state.names.keys().chain(&state.dirs))
            .filter(|p| p.parent() == Some(dir))
            .filter_map(|p| p.file_name()?.to_str().map(str::to_owned))
            .collect())
    }

    fn create(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        let mut state = self.state();
        MemDisk::check(&state)?;
        state.check_parent(path)?;
        if state.names.contains_key(path) || state.dirs.contains(path) {
            return Err(io::ErrorKind::AlreadyExists.into());
        }
        let ino = state.next_inode;
        state.next_inode += 1;
        state.inodes.insert(ino, Inode::default());
        state.names.insert(path.to_path_buf(), ino);
        state.dir_ops.push(DirOp::Create(path.to_path_buf(), ino));
        Ok(Box::new(MemFile {
            disk: self.clone(),
            ino,
        }))
    }

    fn open(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        let state = self.state();
        MemDisk::check(&state)?;
        let ino = *state.names.get(path).ok_or(io::ErrorKind::NotFound)?;
        Ok(Box::new(MemFile {
            disk: self.clone(),
            ino,
        }))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let mut state = self.state();
        let held = |state: &State| {
            let suffix = state.hold_removes.as_deref();
            suffix.is_some_and(|s| path.to_string_lossy().ends_with(s)) && !state.crashed
        };
        while held(&state) {
            state.held_removes += 1;
            self.inner.changed.notify_all();
            state = self.inner.changed.wait(state).expect("mem disk lock");
            state.held_removes -= 1;
        }
        MemDisk::check(&state)?;
        if std::mem::take(&mut state.fail_next_remove) {
            return Err(io::Error::other("injected remove failure"));
        }
        state.names.remove(path).ok_or(io::ErrorKind::NotFound)?;
        state.dir_ops.push(DirOp::Remove(path.to_path_buf()));
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut state = self.state();
        MemDisk::check(&state)?;
        state.check_parent(to)?;
        let ino = state.names.remove(from).ok_or(io::ErrorKind::NotFound)?;
        state.names.insert(to.to_path_buf(), ino);
        (state.dir_ops).push(DirOp::Rename(from.to_path_buf(), to.to_path_buf()));
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut state = self.state();
        MemDisk::check(&state)?;
        if !state.is_dir(dir) {
            return Err(io::ErrorKind::NotFound.into());
        }
        state.durable_dirs.retain(|p| p.parent() != Some(dir));
        let dirs: Vec<PathBuf> = (state.dirs.iter())
            .filter(|p| p.parent() == Some(dir))
            .cloned()
            .collect();
        state.durable_dirs.extend(dirs);
        state.durable_names.retain(|p, _| p.parent() != Some(dir));
        let entries: Vec<(PathBuf, u64)> = state
            .names
            .iter()
            .filter(|(p, _)| p.parent() == Some(dir))
            .map(|(p, &ino)| (p.clone(), ino))
            .collect();
        state.durable_names.extend(entries);
        state.dir_ops.retain(|op| !op.lies_in(dir));
        Ok(())
    }
}

impl StorageFile for MemFile {
    fn size(&self) -> io::Result<u64> {
        let mut state = self.disk.state();
        MemDisk::check(&state)?;
        Ok(state.inode(self.ino).data.len() as u64)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let mut state = self.disk.state();
        MemDisk::check(&state)?;
        if state.fail_read == Some(self.ino) {
            state.fail_read = None;
            return Err(io::Error::other("injected read failure"));
        }
        let data = &state.inode(self.ino).data;
        let start = offset as usize;
        let end = start + buf.len();
        if end > data.len() {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        buf.copy_from_slice(&data[start..end]);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut state = self.disk.state();
        MemDisk::check(&state)?;
        let old = state.inode(self.ino).data.len() as u64;
        let end = offset + buf.len() as u64;
        state.reserve(old, end)?;
        let no_room = |cap| state.used() + buf.len() as u64 > cap;
        if state.cow && state.capacity.is_some_and(no_room) {
            return Err(io::ErrorKind::StorageFull.into());
        }
        let inode = state.inode(self.ino);
        if inode.data.len() < end as usize {
            inode.data.resize(end as usize, 0);
        }
        inode.data[offset as usize..end as usize].copy_from_slice(buf);
        if !buf.is_empty() {
            inode.dirty.extend(offset / SECTOR..=(end - 1) / SECTOR);
        }
        Ok(())
    }

    fn allocate(&self, len: u64) -> io::Result<()> {
        let mut state = self.disk.state();
        MemDisk::check(&state)?;
        let old = state.inode(self.ino).data.len() as u64;
        state.reserve(old, len)?;
        let inode = state.inode(self.ino);
        if inode.data.len() < len as usize {
            inode.data.resize(len as usize, 0);
        }
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        let mut state = self.disk.state();
        while state.hold_syncs && !state.crashed {
            state.held += 1;
            self.disk.inner.changed.notify_all();
            state = self.disk.inner.changed.wait(state).expect("mem disk lock");
            state.held -= 1;
        }
        MemDisk::check(&state)?;
        if std::mem::take(&mut state.fail_next_sync) {
            // As Linux after a failed fsync: the pages count as clean, and what they hold
            // reaches the disk only if it is written again.
            state.inode(self.ino).dirty.clear();
            return Err(io::Error::other("injected fsync failure"));
        }
        state.data_syncs += 1;
        state.inode(self.ino).sync();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(disk: &MemDisk, path: &str) {
        let file = disk.create(Path::new(path)).unwrap();
        file.write_at(b"data", 0).unwrap();
        file.sync_data().unwrap();
    }

    #[test]
    fn a_directory_whose_entry_was_never_synced_is_lost_with_its_files() {
        let disk = MemDisk::new();
        let missing = disk.create(Path::new("/a/f")).unwrap_err();
        assert_eq!(missing.kind(), io::ErrorKind::NotFound);
        disk.create_dir_all(Path::new("/a/b")).unwrap();
        file(&disk, "/a/b/f");
        disk.sync_dir(Path::new("/a/b")).unwrap();
        assert_eq!(disk.list(Path::new("/a")).unwrap(), ["b"]);
        // The file's entry is durable in /a/b, but /a/b's own entry is not in /a.
        let lost = disk.crash(Crash::LoseUnsynced);
        assert_eq!(lost.contents(Path::new("/a/b/f")), None);
        let gone = lost.list(Path::new("/a")).unwrap_err();
        assert_eq!(gone.kind(), io::ErrorKind::NotFound);

        let disk = MemDisk::new();
        disk.create_dir_all(Path::new("/a/b")).unwrap();
        file(&disk, "/a/b/f");
        for dir in ["/", "/a", "/a/b"] {
            disk.sync_dir(Path::new(dir)).unwrap();
        }
        let kept = disk.crash(Crash::LoseUnsynced);
        assert_eq!(kept.contents(Path::new("/a/b/f")).unwrap(), b"data");
    }

    #[test]
    fn a_failed_sync_drops_what_it_should_have_written() {
        let disk = MemDisk::new();
        disk.create_dir_all(Path::new("/d")).unwrap();
        let file = disk.create(Path::new("/d/f")).unwrap();
        disk.sync_dir(Path::new("/")).unwrap();
        disk.sync_dir(Path::new("/d")).unwrap();
        file.write_at(b"lost", 0).unwrap();
        disk.fail_next_sync();
        assert!(file.sync_data().is_err());
        file.sync_data().unwrap();
        assert_eq!(
            disk.contents(Path::new("/d/f")).unwrap(),
            b"lost",
            "still read"
        );
        let crashed = disk.crash(Crash::LoseUnsynced);
        let image = crashed.contents(Path::new("/d/f")).unwrap();
        assert_eq!(
            image, [0; 4],
            "its length kept by the later sync, its bytes never written"
        );
    }

    #[test]
    fn each_directory_operation_is_kept_or_lost_on_its_own_and_a_rename_whole() {
        // Two creates and a rename since /d was last synced.
        let unsynced = || {
            let disk = MemDisk::new();
            disk.create_dir_all(Path::new("/d")).unwrap();
            disk.sync_dir(Path::new("/")).unwrap();
            file(&disk, "/d/old");
            disk.sync_dir(Path::new("/d")).unwrap();
            file(&disk, "/d/a");
            file(&disk, "/d/b");
            disk.rename(Path::new("/d/old"), Path::new("/d/new"))
                .unwrap();
            disk
        };
        let names = |disk: &MemDisk| {
            let mut names = disk.list(Path::new("/d")).unwrap();
            names.sort();
            names
        };
        let mut seen = BTreeSet::new();
        for seed in 0..64 {
            let image = names(&unsynced().crash(Crash::Tear { seed }));
            let renamed = image.contains(&"new".to_string());
            assert_ne!(
                renamed,
                image.contains(&"old".to_string()),
                "a rename is kept whole: {image:?}"
            );
            seen.insert(image);
        }
        // Both creates, either, or neither; the rename kept or not: every mix comes up.
        assert_eq!(seen.len(), 8, "{seen:?}");
        // A sync of the directory makes them all durable.
        let disk = unsynced();
        disk.sync_dir(Path::new("/d")).unwrap();
        assert_eq!(
            names(&disk.crash(Crash::Tear { seed: 0 })),
            ["a", "b", "new"]
        );
    }

    #[test]
    fn a_failed_read_fails_once_and_changes_nothing() {
        let disk = MemDisk::new();
        file(&disk, "/f");
        let f = disk.open(Path::new("/f")).unwrap();
        disk.fail_next_read(Path::new("/f"));
        let mut buf = [0; 4];
        assert!(f.read_at(&mut buf, 0).is_err());
        f.read_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"data");
    }
}
