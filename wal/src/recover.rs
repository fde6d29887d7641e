//! Recovery: find the segments, check every frame, replay, cut a torn tail.

use std::collections::VecDeque;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::frame::{self, Stop, HEADER};
use crate::segment::{parse_segment_name, segment_name, Segment, SPARE_SUFFIX, TRUNCATING_SUFFIX};
use crate::storage::Storage;
use crate::{ident, poison};
use crate::{Lsn, Options, WalError};

/// What recovery found and did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoveryReport {
    /// The lsn the next append gets.
    pub next_lsn: Lsn,
    /// Records handed to the replay callback.
    pub replayed: u64,
    /// Segments the log holds now.
    pub segments: usize,
    /// The torn tail that was cut, if there was one.
    pub torn: Option<TornTail>,
    /// Segments removed: those replay needs nothing of (below a gap under the lsn replay
    /// starts at, or all of them when a snapshot covers the whole log), and empty ones
    /// after the last with data (a crash after a segment was created, before anything in
    /// it was synced).
    pub removed: Vec<PathBuf>,
}

/// A torn tail recovery cut: the bytes of an unfinished write at the end of the log,
/// zeroed (and synced) so that new records go where it began.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TornTail {
    /// The segment it was in.
    pub path: PathBuf,
    /// Where it began: just past the last good record.
    pub offset: u64,
    /// How many bytes were cleared (up to the last non-zero byte cleared).
    pub bytes: u64,
    /// What was found at `offset`.
    pub detail: String,
}

impl fmt::Display for TornTail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cut a torn tail of {} bytes at byte {} of {}: {}",
            self.bytes,
            self.offset,
            self.path.display(),
            self.detail
        )
    }
}

/// The log's state after recovery, for the writer.
pub(crate) struct Recovered {
    /// The log's identity (see `ident`).
    pub(crate) log: u64,
    pub(crate) segments: VecDeque<Arc<Segment>>,
    /// Where the next frame goes in the last segment.
    pub(crate) pos: u64,
    pub(crate) report: RecoveryReport,
}

/// Creates, preallocates and opens a segment of the log whose identity is `log`; nothing
/// is synced.
pub(crate) fn create_segment(
    storage: &dyn Storage,
    dir: &Path,
    log: u64,
    first_lsn: u64,
    capacity: u64,
) -> Result<Segment, WalError> {
    create_segment_named(storage, dir, log, first_lsn, capacity, "")
}

/// As [`create_segment`], in a file named as the segment's with `suffix` (one a
/// truncation renames into place).
pub(crate) fn create_segment_named(
    storage: &dyn Storage,
    dir: &Path,
    log: u64,
    first_lsn: u64,
    capacity: u64,
    suffix: &str,
) -> Result<Segment, WalError> {
    let path = dir.join(segment_name(first_lsn) + suffix);
    let file = match storage.create(&path) {
        Ok(file) => file,
        // Left by a creation that failed, whose removal failed too: no record goes to a
        // segment before its creation succeeds, so it holds nothing, and goes now.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            storage
                .remove(&path)
                .map_err(|e| WalError::io(&path, "remove", e))?;
            storage
                .create(&path)
                .map_err(|e| WalError::io(&path, "create", e))?
        }
        Err(e) => return Err(WalError::io(&path, "create", e)),
    };
    if let Err(e) = file.allocate(capacity) {
        // Best effort: a leftover empty segment is removed by the next roll into it, or
        // by the next recovery.
        let _ = storage.remove(&path);
        return Err(if e.kind() == std::io::ErrorKind::StorageFull {
            WalError::NoSpace { path }
        } else {
            WalError::io(&path, "fallocate", e)
        });
    }
    Ok(Segment {
        path,
        file,
        first_lsn,
        capacity,
        seed: frame::seed(log, first_lsn),
        zeroed: true,
        marks: Default::default(),
        grown_to: Default::default(),
    })
}

/// Renames spare segment `spare` to the segment whose first lsn is `first_lsn` and opens
/// it; nothing is synced. Its frames from its last use stay until appends overwrite them:
/// their lsns are all below `first_lsn` (the compactor set it aside once they were
/// covered), so recovery never takes them for records of this segment.
pub(crate) fn recycle_segment(
    storage: &dyn Storage,
    dir: &Path,
    log: u64,
    spare: &Path,
    first_lsn: u64,
    capacity: u64,
) -> Result<Segment, WalError> {
    let path = dir.join(segment_name(first_lsn));
    storage
        .rename(spare, &path)
        .map_err(|e| WalError::io(spare, "rename", e))?;
    let file = storage
        .open(&path)
        .map_err(|e| WalError::io(&path, "open", e))?;
    Ok(Segment {
        path,
        file,
        first_lsn,
        capacity,
        seed: frame::seed(log, first_lsn),
        zeroed: false,
        marks: Default::default(),
        grown_to: Default::default(),
    })
}

/// What recovery hands each record to: it takes it, or refuses it with the reason (see
/// [`Wal::open`](crate::Wal::open)).
pub(crate) type Replay<'a> = dyn FnMut(Lsn, &[u8]) -> Result<(), String> + 'a;

/// A torn tail to cut: `bytes` bytes zeroed from its offset.
struct Cut {
    torn: TornTail,
    bytes: usize,
}

/// What recovery found, before it changes anything on the disk: the changes it makes
/// once every check has passed.
struct Plan {
    /// The log's identity (see `ident`).
    log: u64,
    /// The log is new: its identity is to be written before its first segment.
    new_log: bool,
    /// The last lsn a poison marker says was durable: records after it are cut, then
    /// the marker goes (see `poison`).
    trusted: Option<u64>,
    /// Spare segments a compactor set aside for recycling before a crash or shutdown:
    /// removed. Only spares set aside by the running log are recycled: a spare left from
    /// before may hold frames of writes that a crash lost, with lsns the log has reused.
    spares: Vec<PathBuf>,
    /// The segments replay reads, in lsn order; none when the log has no segment yet.
    segments: Vec<Segment>,
    /// Empty segments after the last one with data: removed.
    empty: Vec<Segment>,
    /// Segments replay needs none of: removed.
    covered: Vec<Segment>,
    /// The torn tail of the last segment, to cut.
    torn: Option<Cut>,
    next_lsn: u64,
    /// Where the next frame goes in the last segment.
    pos: u64,
    replayed: u64,
}

/// The files of the log in `dir`, found: its segments in lsn order (trailing empty ones
/// apart) and its spare segments; replay starts at `from`. Reads only.
fn find(storage: &dyn Storage, dir: &Path, from: u64) -> Result<Plan, WalError> {
    let names = storage
        .list(dir)
        .map_err(|e| WalError::io(dir, "list", e))?;
    // Spares, and segments a truncation made and a crash left unnamed: they go.
    let spares = (names.iter())
        .filter(|n| n.ends_with(SPARE_SUFFIX) || n.ends_with(TRUNCATING_SUFFIX))
        .map(|n| dir.join(n))
        .collect();
    let found = ident::read(storage, dir)?;
    let trusted = poison::read(storage, dir, &names)?;
    let has_segments = names.iter().any(|n| parse_segment_name(n).is_some());
    // Segments without an identity: a log of the first format (see `ident`).
    let log = found.unwrap_or_else(|| if has_segments { 0 } else { ident::fresh(dir) });
    let mut segments = open_segments(storage, dir, log, &names)?;
    let mut empty = trailing_empty(&mut segments)?;
    // Segments begun after the last durable record hold nothing durable.
    if let Some(trusted) = trusted {
        let keep = segments.partition_point(|s| s.first_lsn <= trusted).max(1);
        let untrusted = segments.split_off(keep.min(segments.len()));
        empty.splice(0..0, untrusted);
    }
    Ok(Plan {
        log,
        new_log: found.is_none() && !has_segments,
        trusted,
        spares,
        segments,
        empty,
        covered: Vec::new(),
        torn: None,
        // A new log, or one started after a snapshot: its first record will be `from`.
        next_lsn: from.max(1),
        pos: 0,
        replayed: 0,
    })
}

/// Checks the log in `dir` and replays it from `from` without changing the disk: what
/// recovery is to do, or why the log cannot open.
fn plan(
    storage: &dyn Storage,
    dir: &Path,
    from: u64,
    replay: &mut Replay<'_>,
) -> Result<Plan, WalError> {
    let mut plan = find(storage, dir, from)?;
    let Some(first) = plan.segments.first() else {
        return Ok(plan);
    };
    if first.first_lsn > from {
        let detail = format!(
            "the log starts at lsn {}, after lsn {from} that replay starts at",
            first.first_lsn
        );
        return Err(WalError::corrupt(&first.path, 0, detail));
    }
    plan.next_lsn = first.first_lsn;
    let last = plan.segments.len() - 1;
    // How many segments, from the first, hold nothing replay needs.
    let mut covered = 0;
    let mut truncated = false;
    for (i, segment) in plan.segments.iter().enumerate() {
        if segment.first_lsn != plan.next_lsn {
            // A gap below `from` is a removal of covered segments that a crash cut short
            // (a directory's removals need not persist in order): those before it go.
            if segment.first_lsn < plan.next_lsn || segment.first_lsn > from {
                let detail = format!(
                    "the segment starts at lsn {} but the one before ends before lsn {}",
                    segment.first_lsn, plan.next_lsn
                );
                return Err(WalError::corrupt(&segment.path, 0, detail));
            }
            covered = i;
            plan.next_lsn = segment.first_lsn;
        }
        let replayed = &mut plan.replayed;
        let limit = plan.trusted.unwrap_or(u64::MAX);
        // Where the next segment begins; after the last with data, an empty one a
        // truncation made. (After a failed fsync, what follows the last durable record
        // is cut from the last segment it reaches, truncated or not.)
        let marker = plan.empty.first().filter(|_| plan.trusted.is_none());
        let after = plan.segments.get(i + 1).or(marker);
        let ends = (i == last, after.map_or(u64::MAX, |s| s.first_lsn));
        let (end, next, cut, superseded) =
            replay_segment(segment, plan.next_lsn, ends, limit, &mut |lsn, p| {
                if lsn.0 >= from {
                    replay(lsn, p)?;
                    *replayed += 1;
                }
                Ok(())
            })?;
        plan.torn = cut.or(plan.torn.take());
        plan.next_lsn = next;
        plan.pos = end;
        truncated = superseded && i == last;
    }
    if truncated {
        // The records from where it begins on were discarded by a truncation: the empty
        // segment after them, which says so, is where the log goes on. (Else an empty
        // segment there is one a crash cut short as it was made: it goes.)
        let current = plan.empty.remove(0);
        (plan.next_lsn, plan.pos, plan.torn) = (current.first_lsn, 0, None);
        plan.segments.push(current);
    }
    if plan.next_lsn < from {
        // A snapshot past the log's end (a follower's, installed from its leader) covers
        // the whole log: it starts again at `from`.
        covered = plan.segments.len();
        (plan.next_lsn, plan.pos, plan.torn) = (from, 0, None);
    }
    let needed = plan.segments.split_off(covered);
    plan.covered = std::mem::replace(&mut plan.segments, needed);
    Ok(plan)
}

/// Recovers the log in `dir` (see [`Wal::open`](crate::Wal::open)). Every check comes
/// first: a log that cannot open is left as it was found.
pub(crate) fn recover(
    storage: &dyn Storage,
    dir: &Path,
    options: &Options,
    from: u64,
    replay: &mut Replay<'_>,
) -> Result<Recovered, WalError> {
    let plan = plan(storage, dir, from, replay)?;
    for path in &plan.spares {
        storage
            .remove(path)
            .map_err(|e| WalError::io(path, "remove", e))?;
    }
    let mut removed = Vec::with_capacity(plan.empty.len() + plan.covered.len());
    for segment in plan.covered.into_iter().chain(plan.empty) {
        storage
            .remove(&segment.path)
            .map_err(|e| WalError::io(&segment.path, "remove", e))?;
        removed.push(segment.path);
    }
    if plan.new_log {
        ident::write(storage, dir, plan.log)?;
    }
    let mut segments = plan.segments;
    if segments.is_empty() {
        let first = create_segment(storage, dir, plan.log, plan.next_lsn, options.segment_bytes)?;
        segments.push(first);
    }
    let last = segments.len() - 1;
    if let Some(tail) = &plan.torn {
        cut(&segments[last], tail.torn.offset, tail.bytes)?;
    }
    let end = (plan.pos, plan.next_lsn);
    let pos = make_current(
        storage,
        dir,
        &mut segments[last],
        options.segment_bytes,
        end,
    )?;
    if plan.trusted.is_some() {
        poison::remove(storage, dir)?;
    }
    let report = RecoveryReport {
        next_lsn: Lsn(plan.next_lsn),
        replayed: plan.replayed,
        segments: segments.len(),
        torn: plan.torn.map(|tail| tail.torn),
        removed,
    };
    Ok(Recovered {
        log: plan.log,
        segments: segments.into_iter().map(Arc::new).collect(),
        pos,
        report,
    })
}

/// Checks and replays one segment whose first record is `first_lsn`, up to lsn `limit`;
/// returns where its records end, the next lsn, and the torn tail to cut, with how many
/// bytes from its offset to zero (only the last segment may have one). Records past
/// `limit`, written after an fsync failed, are cut unread. Records at or after
/// `next_segment`, where the next segment begins, were discarded by a truncation
/// (`Wal::truncate_after`): the segment ends before them, and the last value returned
/// says there were some.
fn replay_segment(
    segment: &Segment,
    first_lsn: u64,
    (is_last, next_segment): (bool, u64),
    limit: u64,
    replay: &mut Replay<'_>,
) -> Result<(u64, u64, Option<Cut>, bool), WalError> {
    let buf = read_all(segment)?;
    // `max_record_bytes` limits what is appended from now on; records already written
    // under a larger limit are read back whole. Only the segment itself bounds a length.
    let read_limit = buf.len();
    let scan = frame::scan(
        &buf,
        first_lsn,
        segment.seed,
        read_limit,
        |lsn, _, payload| {
            if lsn > limit || lsn >= next_segment {
                return Err(String::new());
            }
            replay(Lsn(lsn), payload)
        },
    );
    let at = scan.end as u64;
    let refused = matches!(scan.stop, Stop::Refused(_));
    let superseded = refused && scan.next_lsn >= next_segment;
    let end = if superseded {
        // Records a truncation discarded: the next segment begins before them.
        End::Clean
    } else if refused && scan.next_lsn > limit {
        let detail = format!(
            "records from lsn {} on, written after an fsync failed",
            scan.next_lsn
        );
        let clear = frame::after_end(&buf, scan.end, scan.next_lsn, segment.seed, read_limit).end;
        End::Tail { detail, clear }
    } else {
        check_end(&buf, &scan, segment.seed, read_limit)
    };
    let torn = match end {
        End::Clean => None,
        End::Corrupt(detail) => return Err(WalError::corrupt(&segment.path, at, detail)),
        End::Tail { detail, .. } if !is_last => {
            return Err(WalError::corrupt(&segment.path, at, detail))
        }
        End::Tail { detail, clear } => {
            // Clear the header at the end, and every frame of the unfinished write: the
            // log reuses their lsns. Other bytes past the end (what is left of torn
            // frames, or of a recycled segment's last use) can never read as records.
            let clear = clear.max(scan.end + HEADER).min(buf.len());
            let bytes = frame::nonzero_end(&buf[..clear], scan.end) - scan.end;
            let torn = TornTail {
                path: segment.path.clone(),
                offset: at,
                bytes: bytes as u64,
                detail,
            };
            Some(Cut {
                torn,
                bytes: clear - scan.end,
            })
        }
    };
    Ok((at, scan.next_lsn, torn, superseded))
}

/// Opens the segments among `names`, the files of `dir`, in lsn order.
fn open_segments(
    storage: &dyn Storage,
    dir: &Path,
    log: u64,
    names: &[String],
) -> Result<Vec<Segment>, WalError> {
    let mut found: Vec<u64> = names
        .iter()
        .filter_map(|name| parse_segment_name(name))
        .collect();
    found.sort_unstable();
    let mut segments = Vec::with_capacity(found.len());
    for lsn in found {
        let path = dir.join(segment_name(lsn));
        if lsn == 0 || lsn > crate::MAX_NAMED_LSN {
            let detail = format!("a segment named for lsn {lsn}, which no log has");
            return Err(WalError::corrupt(&path, 0, detail));
        }
        let file = storage
            .open(&path)
            .map_err(|e| WalError::io(&path, "open", e))?;
        let capacity = file.size().map_err(|e| WalError::io(&path, "stat", e))?;
        segments.push(Segment {
            path,
            file,
            first_lsn: lsn,
            capacity,
            seed: frame::seed(log, lsn),
            zeroed: false,
            marks: Default::default(),
            grown_to: Default::default(),
        });
    }
    Ok(segments)
}

/// Readies the last segment for appends: preallocated, its data ending on a sector
/// (`end_on_a_sector`, from `pos`), and synced with its directory; returns where the next
/// write goes.
fn make_current(
    storage: &dyn Storage,
    dir: &Path,
    current: &mut Segment,
    segment_bytes: u64,
    (pos, next_lsn): (u64, u64),
) -> Result<u64, WalError> {
    if current.capacity < segment_bytes {
        // A crash lost the preallocation, or the segment size grew since.
        current
            .file
            .allocate(segment_bytes)
            .map_err(|e| WalError::io(&current.path, "fallocate", e))?;
        current.capacity = segment_bytes;
    }
    let pos = end_on_a_sector(current, pos, next_lsn)?;
    // What recovery read may be in the page cache only (the process died, the machine
    // did not): sync it, with what was cut and the filler, before calling any of it
    // durable. Only the last segment can hold unsynced data: the syncer syncs a segment
    // before it writes the next.
    current
        .file
        .sync_data()
        .map_err(|e| WalError::io(&current.path, "fdatasync", e))?;
    storage
        .sync_dir(dir)
        .map_err(|e| WalError::io(dir, "fsync directory", e))?;
    Ok(pos)
}

/// How the data of a segment ends, past its last good record.
enum End {
    /// At an end marker, with no frame of this segment's writes after it.
    Clean,
    /// A write torn by a crash at the log's tail; `clear` is where its last valid frame
    /// ends.
    Tail { detail: String, clear: usize },
    /// Damage nothing but corruption explains.
    Corrupt(String),
}

fn check_end(buf: &[u8], scan: &frame::Scan, seed: u32, max_payload: usize) -> End {
    let damage = match &scan.stop {
        Stop::Gap(detail) | Stop::Refused(detail) => return End::Corrupt(detail.clone()),
        Stop::Damaged(detail) => Some(detail.clone()),
        Stop::Clean => None,
    };
    let found = frame::after_end(buf, scan.end, scan.next_lsn, seed, max_payload);
    if let Some(at) = found.later_write {
        let what = damage.unwrap_or_else(|| "an end marker".to_string());
        return End::Corrupt(format!(
            "{what}, and a record written after it follows at byte {at}"
        ));
    }
    let detail = match (damage, found.unfinished) {
        (Some(detail), _) => detail,
        // A header lost whole reads as zeros, though the rest of its write may be there.
        (None, Some(at)) => {
            format!("a lost header, and a record of the same write follows at byte {at}")
        }
        (None, None) => return End::Clean,
    };
    End::Tail {
        detail,
        clear: found.end,
    }
}

/// Takes the segments after the last one with data out of `segments` (keeping the first
/// if none has any), to be removed.
///
/// Such segments were created (or recycled) by a roll whose first write never reached
/// the disk. A segment counts as empty only if its first header does not name its first
/// lsn and it holds no valid frame of its own (one with an lsn at or past its first)
/// anywhere: one whose first header is zero but that holds such a frame further on is
/// kept and scanned, so that damage to a synced header cannot pass for an empty segment.
fn trailing_empty(segments: &mut Vec<Segment>) -> Result<Vec<Segment>, WalError> {
    let mut keep = segments.len();
    while keep > 1 && is_empty(&segments[keep - 1])? {
        keep -= 1;
    }
    Ok(segments.split_off(keep))
}

fn is_empty(segment: &Segment) -> Result<bool, WalError> {
    // The common case, a segment whose first header names its first lsn, without reading
    // the whole of it (it is scanned next anyway). A damaged first frame is scanned too.
    let mut header = [0u8; HEADER];
    let n = (segment.capacity as usize).min(HEADER);
    segment
        .file
        .read_at(&mut header[..n], 0)
        .map_err(|e| WalError::io(&segment.path, "read", e))?;
    if n == HEADER && frame::header_lsn(&header, 0) == segment.first_lsn {
        return Ok(false);
    }
    let buf = read_all(segment)?;
    let found = frame::after_end(&buf, 0, segment.first_lsn, segment.seed, buf.len());
    Ok(found.later_write.is_none() && found.unfinished.is_none())
}

fn read_all(segment: &Segment) -> Result<Vec<u8>, WalError> {
    let mut buf = vec![0; segment.capacity as usize];
    segment
        .file
        .read_at(&mut buf, 0)
        .map_err(|e| WalError::io(&segment.path, "read", e))?;
    Ok(buf)
}

/// Zeroes `bytes` bytes from `offset` (synced by `make_current`).
fn cut(segment: &Segment, offset: u64, bytes: usize) -> Result<(), WalError> {
    segment
        .file
        .write_at(&vec![0; bytes], offset)
        .map_err(|e| WalError::io(&segment.path, "write", e))
}

/// Takes the end of the data at `pos` to the next sector with a filler frame (sealed as
/// the write of record `next_lsn` would be) and an end marker after it, so that the
/// first write after recovery starts a sector of its own, as every later one does: a
/// torn write must not garble records that recovery is about to call durable. The data
/// ends mid-sector where a torn write was cut inside it (the bytes before the cut were
/// never synced), or in a log written before fillers. Not synced here. Returns where the
/// next write goes.
fn end_on_a_sector(segment: &Segment, pos: u64, next_lsn: u64) -> Result<u64, WalError> {
    let len = frame::filler_len(pos);
    if len == 0 || pos + len + HEADER as u64 > segment.capacity {
        // At a sector already; or too near the segment's end for the next record, which
        // then starts a segment of its own.
        return Ok(pos);
    }
    let mut buf = Vec::with_capacity(len as usize + HEADER);
    frame::push_filler(&mut buf, len as usize);
    frame::seal(&mut buf, next_lsn, segment.seed);
    buf.resize(buf.len() + HEADER, 0);
    segment
        .file
        .write_at(&buf, pos)
        .map_err(|e| WalError::io(&segment.path, "write", e))?;
    Ok(pos + len)
}
