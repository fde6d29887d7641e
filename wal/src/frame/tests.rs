use super::*;

const MAX: usize = 1 << 20;
/// The crc seed of the segment these tests write (see `seed`).
const SEED: u32 = 0x5EED_0001;

/// Frames for `payloads`, lsns from `first` on, all sealed as one write.
fn write(first: u64, payloads: &[&[u8]]) -> Vec<u8> {
    let mut buf = Vec::new();
    for (i, p) in payloads.iter().enumerate() {
        push_unsealed(&mut buf, first + i as u64, p);
    }
    seal(&mut buf, first, SEED);
    buf
}

fn records(buf: &[u8], first: u64) -> (Vec<(u64, Vec<u8>)>, Scan) {
    let mut out = Vec::new();
    let scan = scan(buf, first, SEED, MAX, |lsn, _, p| {
        out.push((lsn, p.to_vec()));
        Ok(())
    });
    (out, scan)
}

#[test]
fn frames_round_trip_with_padding_to_eight() {
    let payloads: Vec<Vec<u8>> = (0..20).map(|n| vec![n as u8 + 1; n]).collect();
    let refs: Vec<&[u8]> = payloads.iter().map(|p| p.as_slice()).collect();
    let mut buf = write(7, &refs);
    let total: usize = payloads.iter().map(|p| frame_len(p.len())).sum();
    assert_eq!(buf.len(), total);
    assert_eq!(frame_len(0), 24);
    assert_eq!(frame_len(1), 32);
    assert_eq!(frame_len(8), 32);
    assert_eq!(frame_len(9), 40);
    buf.extend_from_slice(&[0; 64]); // the preallocated rest of the segment
    let (got, scan) = records(&buf, 7);
    assert_eq!(scan.stop, Stop::Clean);
    assert_eq!(scan.end, total);
    assert_eq!(scan.next_lsn, 27);
    let want: Vec<(u64, Vec<u8>)> = (7..).zip(payloads).collect();
    assert_eq!(got, want);
}

#[test]
fn a_zero_header_ends_the_data_and_an_exact_fit_ends_cleanly() {
    let buf = write(1, &[b"abc", b"defgh"]);
    let (got, scan) = records(&buf, 1);
    assert_eq!(got.len(), 2);
    assert_eq!(scan.stop, Stop::Clean);
    assert_eq!(scan.end, buf.len());
    let (got, scan) = records(&[0; 40], 5);
    assert!(got.is_empty());
    assert_eq!(
        scan,
        Scan {
            end: 0,
            next_lsn: 5,
            stop: Stop::Clean
        }
    );
}

#[test]
fn every_flipped_bit_of_a_frame_is_detected() {
    let frame = write(3, &[b"hello, log"]);
    for bit in 0..frame.len() * 8 {
        let mut buf = frame.clone();
        buf[bit / 8] ^= 1 << (bit % 8);
        let (got, scan) = records(&buf, 3);
        let in_padding = bit / 8 >= HEADER + 10;
        if in_padding {
            // Padding is not covered: it is never read.
            assert_eq!(got.len(), 1, "bit {bit}");
        } else {
            assert!(got.is_empty(), "bit {bit} went unnoticed");
            assert!(
                matches!(scan.stop, Stop::Damaged(_) | Stop::Gap(_)),
                "bit {bit}: {:?}",
                scan.stop
            );
        }
    }
}

#[test]
fn a_valid_frame_with_the_wrong_lsn_is_a_gap() {
    let mut buf = write(1, &[b"one"]);
    buf.extend(write(3, &[b"three"]));
    let (got, scan) = records(&buf, 1);
    assert_eq!(got.len(), 1);
    assert_eq!(scan.end, 32);
    assert!(matches!(scan.stop, Stop::Gap(ref d) if d.contains("lsn 3 where 2")));
}

#[test]
fn a_length_past_the_limit_or_the_segment_is_damage() {
    let mut buf = write(1, &[&[9; 100]]);
    let (_, scan) = records(&buf[..64], 1);
    assert!(matches!(scan.stop, Stop::Damaged(ref d) if d.contains("past the end")));
    let scan = scan_with_max(&buf, 50);
    assert!(matches!(scan.stop, Stop::Damaged(ref d) if d.contains("limit")));
    buf.truncate(20);
    let (_, scan) = records(&buf, 1);
    assert!(matches!(scan.stop, Stop::Damaged(ref d) if d.contains("partial header")));
}

fn scan_with_max(buf: &[u8], max: usize) -> Scan {
    scan(buf, 1, SEED, max, |_, _, _| Ok(()))
}

#[test]
fn a_later_write_after_damage_is_found_and_so_is_the_same_write() {
    // Write 1 carries lsns 1..=3, write 2 lsns 4..=5.
    let mut buf = write(1, &[b"a", b"b", b"c"]);
    let second = buf.len();
    buf.extend(write(4, &[b"d", b"e"]));
    let written = buf.len();
    buf.extend_from_slice(&[0; 32]);
    // Damage lsn 2 (offset 32): lsn 3 is the same write, lsn 4 a later one.
    let mut torn = buf.clone();
    torn[40] ^= 1;
    let found = after_end(&torn, 32, 2, SEED, MAX);
    assert_eq!(found.later_write, Some(second));
    assert_eq!(found.unfinished, Some(64));
    assert_eq!(found.end, written);
    // Damage lsn 4: only lsn 5 follows, from the same write: a tear.
    let mut torn = buf.clone();
    torn[second + 24] ^= 1;
    let found = after_end(&torn, second, 4, SEED, MAX);
    assert_eq!(found.later_write, None);
    assert_eq!(found.unfinished, Some(second + 32));
    assert_eq!(found.end, written);
    // Past the last record there is nothing.
    assert_eq!(
        after_end(&buf, written, 6, SEED, MAX),
        AfterEnd {
            end: written,
            ..AfterEnd::default()
        }
    );
}

/// A recycled segment: records 20..=21 written over the frames of its last use (lsns
/// 1..=4), with the end marker after them.
fn recycled() -> (Vec<u8>, usize) {
    let mut buf = write(1, &[b"old one", b"old two", b"old three", b"old four"]);
    buf.extend_from_slice(&[0; 64]);
    let new = write(20, &[b"x", b"y"]);
    buf[..new.len()].copy_from_slice(&new);
    buf[new.len()..new.len() + HEADER].fill(0);
    (buf, new.len())
}

#[test]
fn the_frames_of_a_recycled_segments_last_use_are_never_records() {
    let (buf, written) = recycled();
    let (got, scan) = records(&buf, 20);
    assert_eq!(got.len(), 2);
    assert_eq!((scan.end, scan.stop), (written, Stop::Clean));
    // Nothing of this segment's own writes lies past the end marker.
    let found = after_end(&buf, written, 22, SEED, MAX);
    assert_eq!((found.later_write, found.unfinished), (None, None));
    // Without the marker (its write lost), an old frame may sit where the next record
    // was due: it stops the scan as damage, never as a record or a gap.
    let mut lost = buf.clone();
    let old = write(1, &[b"old one", b"old two", b"old three", b"old four"]);
    lost[written..written + 32].copy_from_slice(&old[written..written + 32]);
    let (got, scan) = records(&lost, 20);
    assert_eq!(got.len(), 2);
    assert!(
        matches!(scan.stop, Stop::Damaged(ref d) if d.contains("older than the segment")),
        "{:?}",
        scan.stop
    );
}

#[test]
fn nonzero_end_finds_the_last_written_byte() {
    let mut buf = vec![0u8; 100];
    assert_eq!(nonzero_end(&buf, 10), 10);
    buf[57] = 1;
    assert_eq!(nonzero_end(&buf, 10), 58);
    assert_eq!(nonzero_end(&buf, 60), 60);
}

#[test]
fn a_frame_checks_out_only_in_the_segment_and_log_it_was_sealed_for() {
    let log = 0x0123_4567_89AB_CDEF;
    let mut buf = Vec::new();
    push_unsealed(&mut buf, 9, b"a record");
    seal(&mut buf, 9, seed(log, 9));
    assert!(matches!(
        decode(&buf, 0, seed(log, 9), MAX),
        Decoded::Frame { lsn: 9, .. }
    ));
    for (other_log, first_lsn) in [(log, 8), (log ^ 1, 9), (0, 9)] {
        let found = decode(&buf, 0, seed(other_log, first_lsn), MAX);
        assert!(
            matches!(found, Decoded::Damaged(_)),
            "{other_log:#x} {first_lsn}: {found:?}"
        );
    }
    // A log of the first format seeds nothing: its crcs are over the frame's bytes alone.
    assert_eq!(seed(0, 9), 0);
    let mut plain = Vec::new();
    push_unsealed(&mut plain, 9, b"a record");
    seal(&mut plain, 9, 0);
    let crc = crc32c::crc32c(&plain[4..HEADER + 8]);
    assert_eq!(plain[..4], crc.to_le_bytes());
}
