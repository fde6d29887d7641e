//! Record frames: encoding, checking and scanning a segment's bytes. Pure: no IO.
//!
//! A frame is a 24-byte header, the payload, and zeros up to the next multiple of 8:
//!
//! ```text
//!  0..4   crc32c, seeded by the log and the segment (see `seed`), of bytes 4..24 and
//!         of the payload (little-endian)
//!  4..8   payload length, u32
//!  8..16  lsn, u64
//! 16..24  first: the lsn of the first record of the write that carried this frame, u64
//! 24..    payload, then zero padding to a multiple of 8
//! ```
//!
//! A round's frames end with a **filler** frame (lsn 0, zeros) up to the next multiple of
//! [`ALIGN`] bytes, so that the next write starts in a sector of its own and never
//! rewrites one that holds durable data. A write ends with an all-zero header, the **end
//! marker** (cut short where the segment ends), which the next write overwrites. A
//! segment the running log made needs none: it is preallocated with zeros, and zeros
//! follow what was written. A recycled one (see `syncer`), or one found at recovery, may
//! still hold the frames of its last use past its data, all sealed for another segment,
//! and a scan treats such a frame like damage, never as a record. No real header is all
//! zero: its lsn is at least 1.
//!
//! `first` tells apart, at recovery, a write torn by a crash from damage to data that was
//! already synced. The syncer issues one write per segment per round and starts the next
//! round only after the fsync of this one, so at most one write can be unsynced at a crash,
//! and the disk may have kept any subset of its sectors. A damaged frame followed by valid
//! frames of that same write (`first` at or below the damaged record's lsn) is such a tear;
//! a valid frame from a later write (`first` above it) proves the damaged bytes had been
//! synced before it was written: that is corruption.

/// The crc a frame's own crc continues from, in the segment whose first lsn is
/// `first_lsn` of the log whose identity is `log` (see `ident`): the crc32c of both. A
/// log of the first format (identity 0) seeds nothing: its frames' crcs are over their
/// bytes alone.
pub(crate) fn seed(log: u64, first_lsn: u64) -> u32 {
    if log == 0 {
        return 0;
    }
    let mut bytes = [0; 16];
    bytes[..8].copy_from_slice(&log.to_le_bytes());
    bytes[8..].copy_from_slice(&first_lsn.to_le_bytes());
    crc32c::crc32c(&bytes)
}

/// Bytes in a frame header, and in the end marker.
pub(crate) const HEADER: usize = 24;

/// Where writes start: each round's frames end with a filler frame up to the next
/// multiple of this, so that a later write never rewrites a sector that holds durable
/// data (a write torn by a power loss may garble the whole sector it was writing).
pub(crate) const ALIGN: u64 = 512;

/// The most bytes a filler takes ([`filler_len`]): what an owner leaves free at the end
/// of a segment, so that a write moved past a filler still fits.
pub(crate) const MAX_FILLER: u64 = ALIGN + 32;

/// Bytes of filler that take a write ending at `end` to the next multiple of [`ALIGN`]:
/// 0 when it is one already, and never less than a header with a payload (an empty
/// filler's header could read as all zeros, the end marker).
pub(crate) fn filler_len(end: u64) -> u64 {
    let pad = end.next_multiple_of(ALIGN) - end;
    match pad {
        0 => 0,
        p if p < HEADER as u64 + 8 => p + ALIGN,
        p => p,
    }
}

/// Appends a filler frame of `len` bytes (a header, then zeros): lsn 0, which no record
/// has; sealed like the frames before it, and passed over by a scan.
pub(crate) fn push_filler(buf: &mut Vec<u8>, len: usize) {
    debug_assert!(len >= HEADER && len.is_multiple_of(8));
    let payload = u32::try_from(len - HEADER).expect("a filler is short");
    buf.extend_from_slice(&[0; 4]);
    buf.extend_from_slice(&payload.to_le_bytes());
    buf.resize(buf.len() + len - 8, 0);
}

/// Bytes a frame with a payload of `len` bytes takes.
pub(crate) fn frame_len(len: usize) -> usize {
    HEADER + len.next_multiple_of(8)
}

/// Appends a frame for `payload` with its `first` and crc left zero: [`seal`] fills them
/// in once the write that carries it is known.
pub(crate) fn push_unsealed(buf: &mut Vec<u8>, lsn: u64, payload: &[u8]) {
    let len = u32::try_from(payload.len()).expect("payload length checked against the limit");
    buf.extend_from_slice(&[0; 4]);
    buf.extend_from_slice(&len.to_le_bytes());
    buf.extend_from_slice(&lsn.to_le_bytes());
    buf.extend_from_slice(&[0; 8]);
    buf.extend_from_slice(payload);
    let padding = payload.len().next_multiple_of(8) - payload.len();
    buf.extend_from_slice(&[0; 8][..padding]);
}

/// Sets `first` and the crc (continued from `seed`) of every frame in `buf`, which holds
/// whole frames only.
pub(crate) fn seal(buf: &mut [u8], first: u64, seed: u32) {
    let mut at = 0;
    while at < buf.len() {
        let len = read_u32(buf, at + 4) as usize;
        let end = at + HEADER + len;
        buf[at + 16..at + 24].copy_from_slice(&first.to_le_bytes());
        let crc = crc32c::crc32c_append(seed, &buf[at + 4..end]);
        buf[at..at + 4].copy_from_slice(&crc.to_le_bytes());
        at += frame_len(len);
    }
    assert_eq!(at, buf.len(), "a sealed buffer holds whole frames");
}

/// What lies at an offset of a segment.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Decoded<'a> {
    /// A frame whose crc matches.
    Frame {
        lsn: u64,
        first: u64,
        payload: &'a [u8],
        /// Bytes the whole frame takes, padding included.
        size: usize,
    },
    /// A filler frame whose crc matches: padding to where the next write starts.
    Filler { size: usize },
    /// An all-zero header, or too few bytes left for a header: the end of written data.
    End,
    /// Not a frame.
    Damaged(String),
}

/// Reads the frame at `at` (a multiple of 8) of a segment whose frames' crcs continue from
/// `seed`.
pub(crate) fn decode(buf: &[u8], at: usize, seed: u32, max_payload: usize) -> Decoded<'_> {
    if buf.len() - at < HEADER {
        return if buf[at..].iter().all(|&b| b == 0) {
            Decoded::End
        } else {
            Decoded::Damaged("a partial header at the end of the segment".into())
        };
    }
    let header = &buf[at..at + HEADER];
    if header.iter().all(|&b| b == 0) {
        return Decoded::End;
    }
    let crc = read_u32(buf, at);
    let len = read_u32(buf, at + 4) as usize;
    let lsn = header_lsn(buf, at);
    let first = read_u64(buf, at + 16);
    if len > max_payload {
        return Decoded::Damaged(format!("length {len} exceeds the limit of {max_payload}"));
    }
    let size = frame_len(len);
    if size > buf.len() - at {
        return Decoded::Damaged(format!("length {len} runs past the end of the segment"));
    }
    let actual = crc32c::crc32c_append(seed, &buf[at + 4..at + HEADER + len]);
    if actual != crc {
        return Decoded::Damaged(format!(
            "crc32c {actual:#010x} where the header says {crc:#010x}"
        ));
    }
    if lsn == 0 {
        return Decoded::Filler { size };
    }
    if first > lsn || first == 0 {
        return Decoded::Damaged(format!("first lsn {first} does not fit lsn {lsn}"));
    }
    Decoded::Frame {
        lsn,
        first,
        payload: &buf[at + HEADER..at + HEADER + len],
        size,
    }
}

/// How a scan of a segment ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    /// At an all-zero header or the end of the segment.
    Clean,
    /// At bytes that are not a frame: a torn write if it is the log's tail.
    Damaged(String),
    /// At a valid frame with the wrong lsn: always an error.
    Gap(String),
    /// At a valid frame whose record the reader refused: always an error.
    Refused(String),
}

/// Where a scan of a segment stopped.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Scan {
    /// The offset just past the last good frame.
    pub(crate) end: usize,
    /// The lsn the next frame should carry.
    pub(crate) next_lsn: u64,
    /// Why it stopped.
    pub(crate) stop: Stop,
}

/// Walks the frames of a segment from offset 0, expecting lsns from `first_lsn` on and
/// crcs continued from `seed`, and hands each good record, with the offset its frame
/// begins at, to `on_record`; stops at one it refuses.
pub(crate) fn scan(
    buf: &[u8],
    first_lsn: u64,
    seed: u32,
    max_payload: usize,
    mut on_record: impl FnMut(u64, usize, &[u8]) -> Result<(), String>,
) -> Scan {
    let mut at = 0;
    let mut next_lsn = first_lsn;
    let stop = loop {
        if at == buf.len() {
            break Stop::Clean;
        }
        match decode(buf, at, seed, max_payload) {
            Decoded::End => break Stop::Clean,
            Decoded::Damaged(detail) => break Stop::Damaged(detail),
            Decoded::Filler { size } => at += size,
            // Left from the segment's last use: the write that should have covered it,
            // or its end marker, did not reach the disk.
            Decoded::Frame { lsn, .. } if lsn < first_lsn => {
                break Stop::Damaged(format!(
                    "a record of lsn {lsn}, older than the segment (left from its last use)"
                ));
            }
            Decoded::Frame { lsn, .. } if lsn != next_lsn => {
                break Stop::Gap(format!("lsn {lsn} where {next_lsn} was due"));
            }
            Decoded::Frame { payload, size, .. } => {
                if let Err(detail) = on_record(next_lsn, at, payload) {
                    break Stop::Refused(format!("record {next_lsn}: {detail}"));
                }
                next_lsn += 1;
                at += size;
            }
        }
    };
    Scan {
        end: at,
        next_lsn,
        stop,
    }
}

/// Valid frames found past the end of a segment's records (see [`after_end`]).
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct AfterEnd {
    /// The first frame a later write than the one at the end carried (its `first` is
    /// past the lsn that was due): the data at the end had been synced before it, so
    /// damage there is corruption, not a torn tail.
    pub(crate) later_write: Option<usize>,
    /// The first frame of the unfinished write itself (lsn at or past the one due,
    /// `first` not past it): that write was torn.
    pub(crate) unfinished: Option<usize>,
    /// The offset just past the last frame with an lsn at or past the one due: what a
    /// cut must clear so that no such frame is read as a record after later appends.
    pub(crate) end: usize,
}

/// Looks at every 8-byte offset from `from` to the last non-zero byte for valid frames
/// with an lsn at or past `due`, the lsn the records before `from` left due. Frames of a
/// recycled segment's last use have lower lsns and are passed over; an offset whose lsn
/// could not be in this segment is passed over before its crc is computed.
pub(crate) fn after_end(
    buf: &[u8],
    from: usize,
    due: u64,
    seed: u32,
    max_payload: usize,
) -> AfterEnd {
    let mut found = AfterEnd {
        end: from,
        ..AfterEnd::default()
    };
    // A segment holds fewer frames than it has headers' worth of bytes.
    let highest = due.saturating_add((buf.len() / HEADER) as u64);
    let stop = nonzero_end(buf, from);
    let mut at = from;
    while at < stop && buf.len() - at >= HEADER {
        let lsn = header_lsn(buf, at);
        if (due..=highest).contains(&lsn) {
            if let Decoded::Frame { first, size, .. } = decode(buf, at, seed, max_payload) {
                if first > due {
                    found.later_write.get_or_insert(at);
                } else {
                    found.unfinished.get_or_insert(at);
                }
                found.end = found.end.max(at + size);
            }
        }
        at += 8;
    }
    found
}

/// The offset just past the last non-zero byte at or after `from`, or `from` if there is
/// none.
pub(crate) fn nonzero_end(buf: &[u8], from: usize) -> usize {
    buf[from..]
        .iter()
        .rposition(|&b| b != 0)
        .map_or(from, |i| from + i + 1)
}

/// The lsn field of the header at `at`, unchecked: it says what the frame claims to be,
/// not that it is one. `buf` holds at least a header from `at`.
pub(crate) fn header_lsn(buf: &[u8], at: usize) -> u64 {
    read_u64(buf, at + 8)
}

fn read_u32(buf: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(buf[at..at + 4].try_into().expect("4 bytes"))
}

fn read_u64(buf: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(buf[at..at + 8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests;
