//! Recovery: round trips, torn tails at every byte, corruption, gaps, rolling, removal.

mod common;

use common::*;
use leasemq_wal::{Lsn, MemDisk, Storage, WalError};

#[test]
fn records_round_trip_through_a_reopen() {
    let disk = MemDisk::new();
    let (mut wal, records, report) = open(&disk, small(4096)).unwrap();
    assert!(records.is_empty());
    assert_eq!(report.next_lsn, Lsn(1));
    append_synced(&mut wal, 1..=50);
    assert_eq!(wal.durable(), Lsn(50));
    assert_eq!(wal.last_appended(), Lsn(50));
    drop(wal);
    let (mut wal, records, report) = open(&disk, small(4096)).unwrap();
    assert_eq!(records, expected(1..=50));
    assert_eq!(report.next_lsn, Lsn(51));
    assert_eq!(report.torn, None);
    append_synced(&mut wal, 51..=60);
    drop(wal);
    let (_wal, records, _) = open(&disk, small(4096)).unwrap();
    assert_eq!(records, expected(1..=60));
}

#[test]
fn segments_roll_and_replay_in_order() {
    let disk = MemDisk::new();
    let (mut wal, _, _) = open(&disk, small(256)).unwrap();
    append_synced(&mut wal, 1..=100);
    let files = segment_files(&disk);
    assert!(files.len() > 10, "{} segments", files.len());
    assert_eq!(wal.segments(), files);
    assert!(files[0].ends_with("00000000000000000001.wal"));
    drop(wal);
    let (_wal, records, report) = open(&disk, small(256)).unwrap();
    assert_eq!(records, expected(1..=100));
    assert_eq!(report.segments, files.len());
}

#[test]
fn replay_starts_at_the_given_lsn_and_checks_what_it_skips() {
    let disk = MemDisk::new();
    let (mut wal, _, _) = open(&disk, small(256)).unwrap();
    append_synced(&mut wal, 1..=40);
    drop(wal);
    let (_wal, records, report) = open_from(
        std::sync::Arc::new(disk.clone()),
        dir(),
        small(256),
        Lsn(31),
    )
    .unwrap();
    assert_eq!(records, expected(31..=40));
    assert_eq!(report.replayed, 10);
    drop(_wal);
    disk.flip_bit(&segment_files(&disk)[0], 30, 2);
    let err = open_from(std::sync::Arc::new(disk), dir(), small(256), Lsn(31)).unwrap_err();
    assert!(matches!(err, WalError::Corrupt { .. }), "{err}");
}

/// Writes records 1..=`n` in segments of `segment_bytes`, the last `torn` of them as one
/// write that the crash tears; returns the disk.
fn log_with_last_write(n: u64, torn: u64, segment_bytes: u64) -> MemDisk {
    let disk = MemDisk::new();
    let (mut wal, _, _) = open(&disk, small(segment_bytes)).unwrap();
    append_synced(&mut wal, 1..=n - torn);
    for k in n - torn + 1..=n {
        wal.append(&payload(k)).unwrap();
    }
    wal.sync().unwrap();
    drop(wal);
    disk
}

#[test]
fn a_torn_tail_is_cut_at_every_byte_offset_of_the_last_write() {
    // The last write carries records 9..=12; the crash keeps its first `cut` bytes only.
    let disk = log_with_last_write(12, 4, 16384);
    let seg = &segment_files(&disk)[0];
    let image = disk.contents(seg).unwrap();
    let offsets = frame_offsets(&image);
    assert_eq!(offsets.len(), 12);
    let write_start = offsets[8];
    let end = written_end(&image);
    for cut in write_start..end {
        let damaged = disk.fork();
        damaged.damage(seg, cut as u64, &vec![0; end - cut]);
        // Records whose header and payload lie wholly before the cut survive (padding
        // is zeros anyway).
        let whole = offsets
            .iter()
            .take_while(|&&o| o + 24 + payload_len(&image, o) <= cut)
            .count() as u64;
        let (mut wal, records, report) = open(&damaged, small(16384)).unwrap();
        assert_eq!(records, expected(1..=whole), "cut at byte {cut}");
        let next = whole + 1;
        assert_eq!(report.next_lsn, Lsn(next), "cut at byte {cut}");
        let tail_start = offsets.get(whole as usize).copied().unwrap_or(end);
        match &report.torn {
            Some(torn) => {
                assert_eq!(torn.offset, tail_start as u64, "cut at byte {cut}");
                assert_eq!(&torn.path, seg);
                assert!(torn.bytes > 0 && torn.bytes <= (cut - tail_start) as u64);
            }
            // The lsn's low byte (header byte 8) is never zero here: past it, something
            // is left to cut.
            None => assert!(cut <= tail_start + 8, "cut at byte {cut}: no torn tail"),
        }
        // The log goes on after the cut, and the cut stays cut.
        append_synced(&mut wal, next..=next + 2);
        drop(wal);
        let (_wal, records, report) = open(&damaged, small(16384)).unwrap();
        assert_eq!(records, expected(1..=next + 2), "cut at byte {cut}");
        assert_eq!(report.torn, None);
    }
}

/// The end of the last record's frame in a segment image (the filler after it apart).
fn written_end(image: &[u8]) -> usize {
    let last = *frame_offsets(image).last().expect("a record");
    last + 24 + payload_len(image, last).next_multiple_of(8)
}

fn payload_len(image: &[u8], at: usize) -> usize {
    u32::from_le_bytes(image[at + 4..at + 8].try_into().unwrap()) as usize
}

#[test]
fn garbage_from_any_offset_of_the_last_write_is_a_torn_tail() {
    // A lost sector need not read as zeros on every device: fill the tail with 0xA5.
    let disk = log_with_last_write(10, 3, 16384);
    let seg = &segment_files(&disk)[0];
    let image = disk.contents(seg).unwrap();
    let offsets = frame_offsets(&image);
    let end = written_end(&image);
    for cut in offsets[7]..end {
        let damaged = disk.fork();
        damaged.damage(seg, cut as u64, &vec![0xA5; end - cut]);
        let (_wal, records, report) = open(&damaged, small(16384)).unwrap();
        let whole = records.len() as u64;
        assert!((7..=10).contains(&whole), "cut at {cut}: {whole} records");
        assert_eq!(records, expected(1..=whole), "cut at byte {cut}");
        assert!(report.torn.is_some() || whole == 10, "cut at {cut}");
    }
}

#[test]
fn a_hole_in_the_last_write_is_a_torn_tail_even_with_valid_frames_after_it() {
    let disk = log_with_last_write(10, 5, 16384);
    let seg = &segment_files(&disk)[0];
    let offsets = frame_offsets(&disk.contents(seg).unwrap());
    // Record 7 (in the last write, 6..=10) lost; 8..=10 of the same write survived.
    disk.damage(seg, offsets[6] as u64 + 8, &[0xFF; 8]);
    let (_wal, records, report) = open(&disk, small(16384)).unwrap();
    assert_eq!(records, expected(1..=6));
    assert_eq!(report.torn.unwrap().offset, offsets[6] as u64);
}

#[test]
fn a_damaged_record_followed_by_a_later_write_is_an_error_naming_file_and_offset() {
    let disk = log_with_last_write(10, 5, 16384);
    let seg = &segment_files(&disk)[0];
    let offsets = frame_offsets(&disk.contents(seg).unwrap());
    // Record 3 was written (and synced) before the write of 6..=10.
    for byte in [0, 5, 9, 17, 25] {
        let damaged = disk.fork();
        damaged.flip_bit(seg, (offsets[2] + byte) as u64, 4);
        match open(&damaged, small(16384)) {
            Err(WalError::Corrupt {
                path,
                offset,
                detail,
            }) => {
                assert_eq!(&path, seg);
                assert_eq!(offset, offsets[2] as u64, "{detail}");
                let msg = format!("{}", open(&damaged, small(16384)).unwrap_err());
                assert!(
                    msg.contains("00000000000000000001.wal")
                        && msg.contains(&format!("byte {offset}")),
                    "{msg}"
                );
            }
            other => panic!("byte {byte}: {:?}", other.map(|(_, r, rep)| (r.len(), rep))),
        }
    }
}

/// A record whose frame checks out but which the reader refuses (it does not decode, say)
/// stops the open there, named by file and offset, with the reader's reason; even the
/// last record of the log, which is no torn tail: it was written whole.
#[test]
fn a_record_the_reader_refuses_is_an_error_naming_its_file_and_offset() {
    let disk = MemDisk::new();
    let (mut wal, _, _) = open(&disk, small(256)).unwrap();
    append_synced(&mut wal, 1..=40);
    drop(wal);
    let files = segment_files(&disk);
    for refused in [1, 17, 40] {
        let (file, at) = files
            .iter()
            .rev()
            .find_map(|f| {
                let first: u64 = f.file_stem()?.to_str()?.parse().ok()?;
                let offsets = frame_offsets(&disk.contents(f).unwrap());
                (first <= refused).then(|| (f, offsets[(refused - first) as usize]))
            })
            .unwrap();
        let mut seen = Vec::new();
        let opened = leasemq_wal::Wal::open(
            std::sync::Arc::new(disk.clone()),
            dir(),
            small(256),
            Lsn(1),
            |lsn, _| {
                seen.push(lsn);
                if lsn == Lsn(refused) {
                    return Err("an unknown kind of change".to_string());
                }
                Ok(())
            },
        );
        match opened {
            Err(WalError::Corrupt {
                path,
                offset,
                detail,
            }) => {
                assert_eq!((&path, offset), (file, at as u64), "{detail}");
                assert_eq!(
                    detail,
                    format!("record {refused}: an unknown kind of change")
                );
            }
            other => panic!("record {refused}: {:?}", other.map(|(_, rep)| rep)),
        }
        assert_eq!(
            seen.last(),
            Some(&Lsn(refused)),
            "nothing after it is replayed"
        );
    }
    // Refused nothing: the log was left as it was.
    let (_wal, records, report) = open(&disk, small(256)).unwrap();
    assert_eq!((records, report.torn), (expected(1..=40), None));
}

#[test]
fn a_bit_flip_in_an_earlier_segment_is_an_error_naming_it() {
    let disk = MemDisk::new();
    let (mut wal, _, _) = open(&disk, small(256)).unwrap();
    append_synced(&mut wal, 1..=60);
    drop(wal);
    let files = segment_files(&disk);
    let victim = &files[1];
    let offsets = frame_offsets(&disk.contents(victim).unwrap());
    // The last record of a full segment has nothing after it in that segment: still an
    // error, because later segments exist.
    for &at in [offsets[0], *offsets.last().unwrap()].iter() {
        let damaged = disk.fork();
        damaged.flip_bit(victim, at as u64 + 26, 0);
        match open(&damaged, small(256)) {
            Err(WalError::Corrupt { path, offset, .. }) => {
                assert_eq!(&path, victim);
                assert_eq!(offset, at as u64);
            }
            other => panic!("flip at {at}: {:?}", other.map(|(_, r, _)| r.len())),
        }
    }
}

#[test]
fn a_missing_segment_is_an_lsn_gap() {
    let disk = MemDisk::new();
    let (mut wal, _, _) = open(&disk, small(256)).unwrap();
    append_synced(&mut wal, 1..=60);
    drop(wal);
    let files = segment_files(&disk);
    leasemq_wal::Storage::remove(&disk, &files[2]).unwrap();
    match open(&disk, small(256)) {
        Err(WalError::Corrupt {
            path,
            offset,
            detail,
        }) => {
            assert_eq!(path, files[3]);
            assert_eq!(offset, 0);
            assert!(detail.contains("ends before lsn"), "{detail}");
        }
        other => panic!("{:?}", other.map(|(_, r, _)| r.len())),
    }
}

#[test]
fn a_valid_record_with_the_wrong_lsn_is_an_error() {
    // Copy a record's frame over a later one's: a valid frame, the wrong lsn.
    let disk = log_with_last_write(6, 1, 16384);
    let seg = &segment_files(&disk)[0];
    let image = disk.contents(seg).unwrap();
    let offsets = frame_offsets(&image);
    // Two records whose frames have the same size, so that one fits over the other.
    let (a, b) = (0..5)
        .flat_map(|i| (i + 1..5).map(move |j| (i, j)))
        .find(|&(i, j)| offsets[i + 1] - offsets[i] == offsets[j + 1] - offsets[j])
        .expect("two records of one frame size");
    let frame = image[offsets[a]..offsets[a + 1]].to_vec();
    disk.damage(seg, offsets[b] as u64, &frame);
    match open(&disk, small(16384)) {
        Err(WalError::Corrupt { offset, detail, .. }) => {
            assert_eq!(offset, offsets[b] as u64);
            assert!(
                detail.contains(&format!("lsn {} where {} was due", a + 1, b + 1)),
                "{detail}"
            );
        }
        other => panic!("{:?}", other.map(|(_, r, _)| r.len())),
    }
}

#[test]
fn an_empty_segment_left_by_a_crash_during_a_roll_is_removed() {
    let disk = MemDisk::new();
    let (mut wal, _, _) = open(&disk, small(256)).unwrap();
    append_synced(&mut wal, 1..=5);
    let before = segment_files(&disk);
    // Fill up the segment and roll, but crash before the syncer writes anything.
    disk.hold_syncs();
    let mut n = 6;
    while segment_files(&disk).len() == before.len() {
        wal.append(&payload(n)).unwrap();
        n += 1;
    }
    let crashed = disk.crash(leasemq_wal::Crash::KeepUnsynced);
    drop(wal);
    let (_wal, records, report) = open(&crashed, small(256)).unwrap();
    assert_eq!(records, expected(1..=5));
    assert_eq!(report.removed.len(), 1);
    assert_eq!(segment_files(&crashed), before);
}

#[test]
fn a_zeroed_header_of_synced_data_does_not_pass_for_an_empty_segment() {
    let disk = MemDisk::new();
    let (mut wal, _, _) = open(&disk, small(2048)).unwrap();
    // One write per record, so the last segment holds several writes (one per sector).
    let mut n = 1;
    while segment_files(&disk).len() < 3
        || frame_offsets(&disk.contents(segment_files(&disk).last().unwrap()).unwrap()).len() < 3
    {
        append_synced(&mut wal, n..=n);
        n += 1;
    }
    drop(wal);
    let last = segment_files(&disk).last().unwrap().clone();
    disk.damage(&last, 0, &[0; 24]);
    match open(&disk, small(2048)) {
        Err(WalError::Corrupt {
            path,
            offset,
            detail,
        }) => {
            assert_eq!((path, offset), (last, 0), "{detail}");
        }
        other => panic!("{:?}", other.map(|(_, r, rep)| (r.len(), rep))),
    }
}

/// A record written under a larger `max_record_bytes` is read back whole when the log is
/// opened with a smaller one: the limit is for appends, and a durable record is never cut
/// as a torn tail.
#[test]
fn a_lower_record_limit_never_cuts_records_already_written() {
    let disk = MemDisk::new();
    let (mut wal, _, _) = open(&disk, small(4096)).unwrap();
    wal.append(&[7u8; 1000]).unwrap();
    wal.append(b"after").unwrap();
    wal.submit().unwrap();
    assert_eq!(wal.sync().unwrap(), Lsn(2));
    drop(wal);
    let mut lower = small(4096);
    lower.max_record_bytes = 100;
    let (mut wal, records, report) = open(&disk, lower).unwrap();
    assert_eq!(report.torn, None);
    assert_eq!(
        records,
        vec![(Lsn(1), vec![7u8; 1000]), (Lsn(2), b"after".to_vec())]
    );
    assert!(
        wal.append(&[0u8; 101]).is_err(),
        "appends still keep the new limit"
    );
}

/// A segment or snapshot named for an lsn no log reaches (0 for a segment, or past 2^63)
/// is damage named by its file, not a log to replay: lsn arithmetic on it would overflow.
#[test]
fn files_named_for_lsns_no_log_reaches_are_errors_naming_them() {
    use leasemq_wal::{latest_snapshot, Storage};
    for name in [
        "00000000000000000000.wal",
        "18446744073709551615.wal",
        "09223372036854775808.wal",
    ] {
        let disk = MemDisk::new();
        let (mut wal, _, _) = open(&disk, small(4096)).unwrap();
        append_synced(&mut wal, 1..=3);
        drop(wal);
        let path = dir().join(name);
        disk.create(&path).unwrap();
        match open(&disk, small(4096)) {
            Err(WalError::Corrupt {
                path: named,
                offset,
                detail,
            }) => {
                assert_eq!((named, offset), (path, 0));
                assert!(detail.contains("which no log"), "{detail}");
            }
            other => panic!("{name}: {:?}", other.map(|(_, r, _)| r.len())),
        }
    }
    let disk = MemDisk::new();
    disk.create_dir_all(dir()).unwrap();
    let path = dir().join("snapshot-18446744073709551615.snap");
    disk.create(&path).unwrap();
    match latest_snapshot(&disk, dir()) {
        Err(WalError::Corrupt {
            path: named,
            detail,
            ..
        }) => {
            assert_eq!(named, path);
            assert!(detail.contains("which no log"), "{detail}");
        }
        other => panic!("{:?}", other.map(|s| s.map(|s| s.lsn))),
    }
}

/// Every file of the log's directory, with its length and a hash of its bytes.
fn image(disk: &MemDisk) -> Vec<(String, usize, u64)> {
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    let mut names = disk.list(dir()).unwrap();
    names.sort();
    let hash = |bytes: &[u8]| BuildHasherDefault::<DefaultHasher>::default().hash_one(bytes);
    let file = |name: &String| {
        let bytes = disk.contents(&dir().join(name)).unwrap();
        (name.clone(), bytes.len(), hash(&bytes))
    };
    names.iter().map(file).collect()
}

#[test]
fn a_log_that_cannot_open_is_left_as_it_was_found() {
    // What recovery would remove: a spare set aside by a compactor, an empty segment left
    // by a roll. Then damage that refuses the open, found only as the log is read.
    let disk = MemDisk::new();
    let (mut wal, _, _) = open(&disk, small(256)).unwrap();
    append_synced(&mut wal, 1..=40);
    drop(wal);
    let segments = segment_files(&disk);
    for name in ["00000000000000000900.wal", "00000000000000000007.spare"] {
        let file = disk.create(&dir().join(name)).unwrap();
        file.allocate(256).unwrap();
    }
    disk.flip_bit(&segments[segments.len() - 2], 30, 2);
    let found = image(&disk);
    assert_eq!(
        found.len(),
        segments.len() + 3,
        "with the spare, the empty one, wal.id"
    );
    let err = open(&disk, small(256)).unwrap_err();
    assert!(matches!(err, WalError::Corrupt { .. }), "{err}");
    assert_eq!(image(&disk), found, "nothing removed, nothing zeroed");
}

#[test]
fn a_read_error_fails_the_open_and_is_never_taken_for_a_torn_tail() {
    let disk = MemDisk::new();
    let (mut wal, _, _) = open(&disk, small(4096)).unwrap();
    append_synced(&mut wal, 1..=40);
    drop(wal);
    let found = image(&disk);
    for segment in segment_files(&disk) {
        disk.fail_next_read(&segment);
        let err = open(&disk, small(4096)).unwrap_err();
        let WalError::Io { ref path, .. } = err else {
            panic!("{err}");
        };
        assert_eq!(path, &segment);
        assert_eq!(image(&disk), found, "nothing cut, nothing removed");
    }
    let (_wal, records, report) = open(&disk, small(4096)).unwrap();
    assert_eq!(records, expected(1..=40));
    assert!(report.torn.is_none());
}

#[test]
fn a_snapshot_past_the_logs_end_starts_the_log_again_after_it() {
    // A follower's log ends at 12 (its last write torn); the leader's snapshot covers up
    // to 39.
    let disk = log_with_last_write(12, 4, 16384);
    let seg = &segment_files(&disk)[0];
    let offsets = frame_offsets(&disk.contents(seg).unwrap());
    disk.damage(seg, offsets[10] as u64 + 8, &[0xFF; 8]);
    let arc = std::sync::Arc::new(disk.clone());
    let (mut wal, records, report) = open_from(arc.clone(), dir(), small(16384), Lsn(40)).unwrap();
    assert!(records.is_empty());
    assert_eq!(report.next_lsn, Lsn(40));
    assert_eq!(report.torn, None, "nothing of it is kept to cut");
    assert_eq!(report.removed, std::slice::from_ref(seg));
    assert_eq!(
        segment_files(&disk),
        [dir().join("00000000000000000040.wal")]
    );
    append_synced(&mut wal, 40..=45);
    drop(wal);
    let (_wal, records, _) = open_from(arc, dir(), small(16384), Lsn(40)).unwrap();
    assert_eq!(records, expected(40..=45));
}

#[test]
fn a_gap_below_where_replay_starts_is_a_removal_cut_short() {
    let disk = MemDisk::new();
    let (mut wal, _, _) = open(&disk, small(256)).unwrap();
    append_synced(&mut wal, 1..=100);
    drop(wal);
    let segments = segment_files(&disk);
    assert!(segments.len() > 6, "{} segments", segments.len());
    // The removal of the segments a snapshot covered reached the third, not the first
    // two; replay starts in the sixth.
    disk.remove(&segments[2]).unwrap();
    let first_of = |path: &std::path::Path| -> u64 {
        let name = path.file_name().unwrap().to_str().unwrap();
        name.trim_end_matches(".wal").parse().unwrap()
    };
    let from = first_of(&segments[5]) + 1;
    let arc = std::sync::Arc::new(disk.clone());
    let (_wal, records, report) = open_from(arc.clone(), dir(), small(256), Lsn(from)).unwrap();
    assert_eq!(records, expected(from..=100));
    assert_eq!(report.removed, segments[..2]);
    assert_eq!(segment_files(&disk), segments[3..]);
    drop(_wal);
    // A gap at or past where replay starts is still lost records.
    disk.remove(&segments[6]).unwrap();
    let err = open_from(arc, dir(), small(256), Lsn(from)).unwrap_err();
    assert!(matches!(err, WalError::Corrupt { .. }), "{err}");
}

/// A frame as the first format sealed them, its crc over its own bytes only.
fn plain_frame(lsn: u64, first: u64, payload: &[u8]) -> Vec<u8> {
    let mut frame = vec![0; 4];
    frame.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    frame.extend_from_slice(&lsn.to_le_bytes());
    frame.extend_from_slice(&first.to_le_bytes());
    frame.extend_from_slice(payload);
    let crc = crc32c::crc32c(&frame[4..]);
    frame[..4].copy_from_slice(&crc.to_le_bytes());
    frame.resize(24 + payload.len().next_multiple_of(8), 0);
    frame
}

#[test]
fn a_record_that_holds_a_frame_image_never_passes_for_a_later_write() {
    // A body stored whole in a record, holding the image of a frame that claims a later
    // write than the one it came in.
    let disk = MemDisk::new();
    let (mut wal, _, _) = open(&disk, small(16384)).unwrap();
    append_synced(&mut wal, 1..=8);
    wal.append(&payload(9)).unwrap();
    wal.append(&plain_frame(12, 12, b"forged")).unwrap();
    wal.sync().unwrap();
    drop(wal);
    // The crash kept record 10 of the last write, and lost a sector of record 9.
    let seg = &segment_files(&disk)[0];
    let offsets = frame_offsets(&disk.contents(seg).unwrap());
    disk.damage(seg, offsets[8] as u64 + 8, &[0xFF; 8]);
    let (_wal, records, report) = open(&disk, small(16384)).unwrap();
    assert_eq!(records, expected(1..=8), "a torn tail, not corruption");
    assert_eq!(report.torn.unwrap().offset, offsets[8] as u64);
}

#[test]
fn a_log_of_the_first_format_opens_and_goes_on_in_it() {
    // Records 1..=3 as the first format wrote them: no wal.id, crcs unseeded.
    let disk = MemDisk::new();
    disk.create_dir_all(dir()).unwrap();
    let mut image = Vec::new();
    for lsn in 1..=3 {
        image.extend(plain_frame(lsn, 1, &payload(lsn)));
    }
    let file = disk
        .create(&dir().join("00000000000000000001.wal"))
        .unwrap();
    file.allocate(4096).unwrap();
    file.write_at(&image, 0).unwrap();
    file.sync_data().unwrap();
    disk.sync_dir(dir()).unwrap();
    let (mut wal, records, _) = open(&disk, small(4096)).unwrap();
    assert_eq!(records, expected(1..=3));
    append_synced(&mut wal, 4..=6);
    drop(wal);
    assert!(
        disk.contents(&dir().join("wal.id")).is_none(),
        "still the first format"
    );
    let (_wal, records, _) = open(&disk, small(4096)).unwrap();
    assert_eq!(records, expected(1..=6));
}

#[test]
fn a_log_identity_of_another_format_or_damaged_is_refused_naming_it() {
    let disk = MemDisk::new();
    let (mut wal, _, _) = open(&disk, small(4096)).unwrap();
    append_synced(&mut wal, 1..=3);
    drop(wal);
    let id = dir().join("wal.id");
    // Byte 20 is inside the random identity: its bits are flipped, so that the damage
    // changes it whatever value the identity drew.
    let flipped = !disk.contents(&id).unwrap()[20];
    for (offset, bytes, says) in [
        (8, &[3, 0, 0, 0][..], "crc32c"),
        (20, &[flipped][..], "crc32c"),
        (0, &b"NOTAWAL!"[..], "magic"),
    ] {
        let damaged = disk.fork();
        damaged.damage(&id, offset, bytes);
        let err = open(&damaged, small(4096)).unwrap_err();
        let WalError::Corrupt { path, detail, .. } = &err else {
            panic!("{err}");
        };
        assert_eq!(path, &id);
        assert!(detail.contains(says), "{detail}");
    }
    // A later format, whole: refused as one this build cannot read.
    let mut bytes = disk.contents(&id).unwrap();
    bytes[8..12].copy_from_slice(&3u32.to_le_bytes());
    let crc = crc32c::crc32c(&bytes[..24]);
    bytes[24..28].copy_from_slice(&crc.to_le_bytes());
    disk.damage(&id, 0, &bytes);
    let err = open(&disk, small(4096)).unwrap_err();
    assert!(err.to_string().contains("log format 3"), "{err}");
}

#[test]
fn a_new_logs_directory_survives_a_crash_with_what_was_synced_in_it() {
    // The log's directory, and its parent, are made by the open: their entries must be
    // durable before anything synced in them can be.
    let disk = MemDisk::new();
    let (mut wal, _, _) = open(&disk, small(4096)).unwrap();
    append_synced(&mut wal, 1..=5);
    let crashed = disk.crash(leasemq_wal::Crash::LoseUnsynced);
    drop(wal);
    let (_wal, records, _) = open(&crashed, small(4096)).unwrap();
    assert_eq!(records, expected(1..=5));
}

/// A log holding records 1..=5, then a record filling sectors of its own whose fsync
/// failed: the disk dropped it, the page cache still holds it.
fn with_a_failed_fsync() -> (MemDisk, leasemq_wal::Wal) {
    let disk = MemDisk::new();
    let (mut wal, _, _) = open(&disk, small(4096)).unwrap();
    append_synced(&mut wal, 1..=5);
    disk.fail_next_sync();
    wal.append(&[6; 1500]).unwrap();
    assert!(wal.sync().is_err());
    (disk, wal)
}

#[test]
fn records_written_after_a_failed_fsync_never_come_back_and_leave_no_hole() {
    let (disk, wal) = with_a_failed_fsync();
    drop(wal);
    // Opened again without a reboot: the refused record is not a record.
    let (mut wal, records, report) = open(&disk, small(4096)).unwrap();
    assert_eq!(records, expected(1..=5));
    let detail = report.torn.unwrap().detail;
    assert!(detail.contains("after an fsync failed"), "{detail}");
    assert!(
        disk.contents(&dir().join("wal.poisoned")).is_none(),
        "done with"
    );
    append_synced(&mut wal, 6..=8);
    drop(wal);
    // A power loss then: everything the log called durable, and no hole.
    let crashed = disk.crash(leasemq_wal::Crash::LoseUnsynced);
    let (_wal, records, _) = open(&crashed, small(4096)).unwrap();
    assert_eq!(records, expected(1..=8));
}

#[test]
fn a_process_that_dies_as_an_fsync_failure_is_answered_never_brings_back_what_it_refused() {
    for _ in 0..50 {
        let (disk, wal) = with_a_failed_fsync();
        // The process dies the moment its owner learns of the failure (and could refuse
        // what waited on it); the page cache, holding the record, outlives it.
        let crashed = disk.crash(leasemq_wal::Crash::KeepUnsynced);
        drop(wal);
        let (_wal, records, _) = open(&crashed, small(4096)).unwrap();
        assert_eq!(records, expected(1..=5));
    }
}

#[test]
fn a_write_after_a_recovery_that_cut_a_torn_write_never_garbles_what_it_recovered() {
    use leasemq_wal::Crash;
    let mut cut_mid_sector = 0;
    for seed in 0..200 {
        // Records 1..=3 synced, then a round of 4..=9 written and never synced, torn.
        let disk = MemDisk::new();
        let (mut wal, _, _) = open(&disk, small(65536)).unwrap();
        append_synced(&mut wal, 1..=3);
        disk.hold_syncs();
        // Large enough that the write spans sectors, and its frames straddle them.
        for n in 4..=9 {
            wal.append(&[n as u8; 200]).unwrap();
        }
        wal.submit().unwrap();
        disk.wait_for_held_sync();
        let torn = disk.crash(Crash::Tear { seed });
        disk.release_syncs();
        drop(wal);
        let (mut wal, recovered, report) = open(&torn, small(65536)).unwrap();
        let kept = recovered.len() as u64;
        if report.torn.is_some_and(|t| t.offset % 512 != 0) {
            cut_mid_sector += 1;
        }
        // All it replayed is durable now. The next write, torn on a device that garbles
        // the sectors it was writing, must not take any of it.
        torn.hold_syncs();
        wal.append(&[0xEE; 200]).unwrap();
        wal.submit().unwrap();
        torn.wait_for_held_sync();
        torn.garble_torn_sectors();
        let again = torn.crash(Crash::Tear { seed: seed + 1000 });
        torn.release_syncs();
        drop(wal);
        let (_wal, records, _) = open(&again, small(65536)).unwrap();
        assert!(records.len() as u64 >= kept, "seed {seed}: {records:?}");
        assert_eq!(records[..kept as usize], recovered[..], "seed {seed}");
    }
    assert!(cut_mid_sector > 10, "{cut_mid_sector} cuts inside a sector");
}

#[test]
fn a_write_torn_on_a_device_without_atomic_sectors_never_damages_durable_records() {
    for seed in 0..300 {
        let disk = MemDisk::new();
        disk.garble_torn_sectors();
        let (mut wal, _, _) = open(&disk, small(16384)).unwrap();
        append_synced(&mut wal, 1..=5);
        // The next write is on its way when the power goes.
        disk.hold_syncs();
        for n in 6..=8 {
            wal.append(&payload(n)).unwrap();
        }
        wal.submit().unwrap();
        disk.wait_for_held_sync();
        let crashed = disk.crash(leasemq_wal::Crash::Tear { seed });
        drop(wal);
        let (_wal, records, _) = open(&crashed, small(16384)).unwrap();
        assert!(records.len() >= 5, "seed {seed}: {} records", records.len());
        assert_eq!(records[..5], expected(1..=5), "seed {seed}");
    }
}
