//! Interval histograms, and the HdrHistogram interval logs (`.hlog`) they are written to.
//!
//! A worker thread records into a [`TimedRecorder`]: the whole-run histogram and the
//! histogram of the current interval (one second by default) of the run's clock. When a value
//! falls in a later interval, the finished one is sent, as a [`Piece`], over a channel to the
//! thread that started the run, which folds it into an [`IntervalLog`]: one histogram per
//! interval and histogram name, merged across threads. Recording stays lock-free; the only
//! cross-thread step is one channel send per thread and interval.
//!
//! A single-threaded workload that already keeps whole-run [`Recorder`]s takes its intervals
//! by difference instead ([`Differ`]): at each interval boundary, what each recorder gained
//! since the last boundary.
//!
//! Intervals are indexed by the time a value was *recorded*, as HdrHistogram's own recorders
//! do: a put→ack latency lands in the interval its ack returned in. Interval 0 starts with the
//! measured window; values recorded while the run drains land in the intervals after it.
//! Finished intervals are kept compressed (HdrHistogram's V2 deflate encoding, a few KiB
//! each), so a long run does not hold a full histogram per second.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, BufWriter, Write};
use std::path::Path;
use std::sync::mpsc::Sender;
use std::time::{Duration, SystemTime};

use hdrhistogram::serialization::interval_log::{IntervalLogWriterBuilder, Tag};
use hdrhistogram::serialization::{Deserializer, Serializer, V2DeflateSerializer};
use hdrhistogram::Histogram;

use crate::hist::Recorder;

/// Values are recorded in nanoseconds; the interval max column is written in milliseconds,
/// as Java's `HistogramLogWriter` does by default.
const MAX_VALUE_DIVISOR: f64 = 1e6;

/// Where intervals fall on a run's clock (nanoseconds since its epoch): interval k covers
/// [origin + k × length, origin + (k + 1) × length).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IntervalClock {
    pub origin_ns: u64,
    pub length_ns: u64,
}

impl IntervalClock {
    pub fn new(origin_ns: u64, length: Duration) -> IntervalClock {
        let length_ns = u64::try_from(length.as_nanos()).unwrap_or(u64::MAX);
        assert!(length_ns > 0, "intervals have a length");
        IntervalClock {
            origin_ns,
            length_ns,
        }
    }

    /// The interval `at_ns` falls in (0 for anything before the origin).
    #[inline]
    pub fn index(&self, at_ns: u64) -> u64 {
        at_ns.saturating_sub(self.origin_ns) / self.length_ns
    }

    /// Where interval `index` ends (where the next one starts).
    pub fn end_ns(&self, index: u64) -> u64 {
        self.origin_ns
            .saturating_add(index.saturating_add(1).saturating_mul(self.length_ns))
    }
}

/// One finished interval of one histogram, from one thread.
pub struct Piece {
    /// Which histogram: an index into the log's names.
    pub slot: usize,
    pub index: u64,
    pub hist: Histogram<u64>,
}

/// A worker thread's histogram: the whole run, and (when the run keeps an interval log) the
/// interval being recorded.
pub struct TimedRecorder {
    total: Recorder,
    current: Option<Current>,
}

struct Current {
    clock: IntervalClock,
    slot: usize,
    index: u64,
    /// Where `index` ends: a value recorded at or after it starts a new interval.
    end_ns: u64,
    hist: Histogram<u64>,
    tx: Sender<Piece>,
}

impl Default for TimedRecorder {
    fn default() -> Self {
        TimedRecorder::new(None)
    }
}

impl TimedRecorder {
    /// Records the whole run, and by interval into `log` (clock, slot, channel) if given.
    pub fn new(log: Option<(IntervalClock, usize, Sender<Piece>)>) -> TimedRecorder {
        let total = Recorder::new();
        let current = log.map(|(clock, slot, tx)| Current {
            clock,
            slot,
            index: 0,
            end_ns: clock.end_ns(0),
            hist: Histogram::new_from(total.histogram()),
            tx,
        });
        TimedRecorder { total, current }
    }

    /// Records `value` (nanoseconds), taken at `at_ns` on the run's clock.
    #[inline]
    pub fn record(&mut self, at_ns: u64, value: u64) {
        self.total.record(value);
        if let Some(c) = &mut self.current {
            if at_ns >= c.end_ns {
                c.rotate(c.clock.index(at_ns));
            }
            c.hist.saturating_record(value);
        }
    }

    /// Hands the current interval over if `now_ns` has left it: for threads that may go
    /// idle, so that their last interval does not wait for their next value.
    pub fn tick(&mut self, now_ns: u64) {
        if let Some(c) = &mut self.current {
            if now_ns >= c.end_ns && !c.hist.is_empty() {
                c.rotate(c.clock.index(now_ns));
            }
        }
    }

    /// Hands over the last interval and returns the whole-run histogram.
    pub fn finish(mut self) -> Recorder {
        if let Some(mut c) = self.current.take() {
            c.send();
        }
        self.total
    }
}

impl Current {
    fn rotate(&mut self, index: u64) {
        self.send();
        self.index = index;
        self.end_ns = self.clock.end_ns(index);
    }

    fn send(&mut self) {
        if self.hist.is_empty() {
            return;
        }
        let fresh = Histogram::new_from(&self.hist);
        let hist = std::mem::replace(&mut self.hist, fresh);
        // The receiver lives until every worker has finished; if it is gone the run is being
        // torn down and the interval is of no use to anyone.
        let _ = self.tx.send(Piece {
            slot: self.slot,
            index: self.index,
            hist,
        });
    }
}

/// Takes interval histograms from whole-run recorders by difference: at each boundary, what
/// each recorder gained since the last one. For a workload run by one thread, which can check
/// the clock between its own steps.
pub struct Differ {
    clock: IntervalClock,
    index: u64,
    end_ns: u64,
    /// Each recorder as it was at the last boundary.
    last: Vec<Histogram<u64>>,
}

impl Differ {
    pub fn new(clock: IntervalClock, slots: usize) -> Differ {
        let empty = Recorder::new();
        Differ {
            clock,
            index: 0,
            end_ns: clock.end_ns(0),
            last: vec![empty.histogram().clone(); slots],
        }
    }

    /// True once `now_ns` has left the current interval: time for [`Differ::take`].
    #[inline]
    pub fn due(&self, now_ns: u64) -> bool {
        now_ns >= self.end_ns
    }

    /// Closes the current interval with what each recorder gained in it, and opens the one
    /// `now_ns` falls in.
    pub fn take(&mut self, now_ns: u64, recorders: &[&Recorder], log: &mut IntervalLog) {
        assert_eq!(recorders.len(), self.last.len(), "one recorder per slot");
        for (slot, (rec, last)) in recorders.iter().zip(&mut self.last).enumerate() {
            let now = rec.histogram();
            if now.len() == last.len() {
                continue;
            }
            let mut gained = now.clone();
            gained
                .subtract(&*last)
                .expect("a recorder only grows, within the same bounds");
            log.add(slot, self.index, &gained);
            last.clone_from(now);
        }
        self.index = self.clock.index(now_ns).max(self.index + 1);
        self.end_ns = self.clock.end_ns(self.index);
    }
}

enum Entry {
    Open(Histogram<u64>),
    /// V2 deflate encoding, for intervals nothing is expected to arrive for any more.
    Packed(Vec<u8>),
}

/// The interval histograms of one run, merged across threads, by histogram name.
pub struct IntervalLog {
    names: Vec<String>,
    /// Wall-clock time at the run clock's 0.
    epoch: SystemTime,
    clock: IntervalClock,
    /// The length of the measured window: intervals covering it are written even if empty.
    window_ns: u64,
    /// Written on every interval (e.g. which sweep step).
    tag: Option<String>,
    /// When the run stopped recording: the last interval is written only up to here.
    closed_ns: Option<u64>,
    entries: BTreeMap<(usize, u64), Entry>,
}

impl IntervalLog {
    pub fn new(names: &[&str], epoch: SystemTime, clock: IntervalClock, window: Duration) -> Self {
        IntervalLog {
            names: names.iter().map(|n| n.to_string()).collect(),
            epoch,
            clock,
            window_ns: u64::try_from(window.as_nanos()).unwrap_or(u64::MAX),
            tag: None,
            closed_ns: None,
            entries: BTreeMap::new(),
        }
    }

    /// Tags every interval (letters, digits, '-', '_' and '.': no commas or spaces).
    pub fn set_tag(&mut self, tag: &str) {
        assert!(Tag::new(tag).is_some(), "{tag:?} is not a valid tag");
        self.tag = Some(tag.to_string());
    }

    /// Notes that recording stopped at `at_ns`: no interval is written as reaching past it.
    pub fn close(&mut self, at_ns: u64) {
        self.closed_ns = Some(at_ns);
    }

    pub fn absorb(&mut self, piece: Piece) {
        self.add(piece.slot, piece.index, &piece.hist);
    }

    /// Adds `hist` to interval `index` of histogram `slot`.
    pub fn add(&mut self, slot: usize, index: u64, hist: &Histogram<u64>) {
        assert!(slot < self.names.len(), "slot {slot} has no name");
        let entry = self
            .entries
            .entry((slot, index))
            .or_insert_with(|| Entry::Open(Histogram::new_from(hist)));
        if let Entry::Packed(bytes) = entry {
            // A late piece: reopen the interval.
            *entry = Entry::Open(unpack(bytes));
        }
        let Entry::Open(open) = entry else {
            unreachable!("reopened above")
        };
        open.add(hist)
            .expect("interval histograms share their bounds");
    }

    /// Compresses every interval before `index`, to keep a long run's memory small.
    pub fn pack_before(&mut self, index: u64) {
        let mut serializer = V2DeflateSerializer::new();
        for (&(_, i), entry) in self.entries.iter_mut() {
            if i >= index {
                continue;
            }
            if let Entry::Open(h) = entry {
                let mut bytes = Vec::new();
                serializer
                    .serialize(h, &mut bytes)
                    .expect("serializing into memory");
                *entry = Entry::Packed(bytes);
            }
        }
    }

    pub fn clock(&self) -> IntervalClock {
        self.clock
    }

    /// The interval `now_ns` falls in.
    pub fn index_at(&self, now_ns: u64) -> u64 {
        self.clock.index(now_ns)
    }

    /// Values recorded in histogram `slot`, over every interval.
    pub fn total_count(&self, slot: usize) -> u64 {
        self.entries
            .range((slot, 0)..=(slot, u64::MAX))
            .map(|(_, e)| match e {
                Entry::Open(h) => h.len(),
                Entry::Packed(bytes) => unpack(bytes).len(),
            })
            .sum()
    }

    /// Intervals to write for `slot`: every one of the measured window, and any after it
    /// that holds values.
    fn intervals(&self, slot: usize) -> u64 {
        let window = self.window_ns.div_ceil(self.clock.length_ns).max(1);
        let last = self
            .entries
            .range((slot, 0)..=(slot, u64::MAX))
            .next_back()
            .map_or(0, |(&(_, i), _)| i + 1);
        window.max(last)
    }

    /// How long interval `index` is: its length, cut short where recording stopped.
    fn length_of(&self, index: u64) -> Duration {
        let start = self.clock.origin_ns + index * self.clock.length_ns;
        let end = self.clock.end_ns(index);
        let end = self.closed_ns.map_or(end, |c| end.min(c.max(start)));
        Duration::from_nanos(end - start)
    }

    /// Wall-clock time interval `index` starts at.
    fn start_of(&self, index: u64) -> SystemTime {
        let ns = self.clock.origin_ns + index * self.clock.length_ns;
        self.epoch + Duration::from_nanos(ns)
    }
}

fn unpack(bytes: &[u8]) -> Histogram<u64> {
    Deserializer::new()
        .deserialize(&mut &bytes[..])
        .expect("reading back what was packed")
}

/// Writes one `NAME.hlog` per histogram name into `dir`, the intervals of every log in turn
/// (several logs: one per sweep step, told apart by their tags). Timestamps count seconds
/// from the start of the first log's measured window (its `BaseTime`). Returns the files
/// written, by histogram name.
pub fn write_hlogs(dir: &Path, logs: &[&IntervalLog]) -> io::Result<Vec<(String, String)>> {
    let Some(first) = logs.first() else {
        return Ok(Vec::new());
    };
    let base = first.start_of(0);
    let empty = Recorder::new();
    let mut serializer = V2DeflateSerializer::new();
    let mut files = Vec::new();
    for (slot, name) in first.names.iter().enumerate() {
        let file = format!("{name}.hlog");
        let mut w = BufWriter::new(fs::File::create(dir.join(&file))?);
        let mut log = IntervalLogWriterBuilder::new()
            .add_comment(&format!(
                "[Logged with leasemq-loadgen {}]",
                env!("CARGO_PKG_VERSION")
            ))
            .add_comment("[Histogram log format version 1.3]")
            .add_comment(&format!("[{name}: values in nanoseconds]"))
            .with_start_time(base)
            .with_base_time(base)
            .with_max_value_divisor(MAX_VALUE_DIVISOR)
            .begin_log_with(&mut w, &mut serializer)?;
        for run in logs {
            assert_eq!(run.names, first.names, "every log has the same histograms");
            let tag = run.tag.as_deref().and_then(Tag::new);
            for index in 0..run.intervals(slot) {
                let unpacked;
                let hist = match run.entries.get(&(slot, index)) {
                    Some(Entry::Open(h)) => h,
                    Some(Entry::Packed(bytes)) => {
                        unpacked = unpack(bytes);
                        &unpacked
                    }
                    None => empty.histogram(),
                };
                let start = run
                    .start_of(index)
                    .duration_since(base)
                    .unwrap_or(Duration::ZERO);
                log.write_histogram(hist, start, run.length_of(index), tag)
                    .map_err(|e| io::Error::other(e.to_string()))?;
            }
        }
        drop(log);
        w.flush()?;
        files.push((name.clone(), file));
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hdrhistogram::serialization::interval_log::{IntervalLogIterator, LogEntry};
    use std::sync::mpsc;

    /// Every interval of an .hlog: (tag, start, duration, histogram).
    fn read_back(text: &[u8]) -> Vec<(Option<String>, Duration, Duration, Histogram<u64>)> {
        use base64::Engine as _;
        IntervalLogIterator::new(text)
            .filter_map(|e| match e.expect("the log parses") {
                LogEntry::Interval(i) => Some(i),
                _ => None,
            })
            .map(|i| {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(i.encoded_histogram())
                    .expect("base64");
                let hist: Histogram<u64> = Deserializer::new()
                    .deserialize(&mut &bytes[..])
                    .expect("a histogram");
                (
                    i.tag().map(|t| t.as_str().to_string()),
                    i.start_timestamp(),
                    i.duration(),
                    hist,
                )
            })
            .collect()
    }

    #[test]
    fn threads_intervals_merge_and_read_back() {
        // Milliseconds: the log writes timestamps to the millisecond.
        const MS: u64 = 1_000_000;
        let clock = IntervalClock::new(1_000 * MS, Duration::from_millis(100));
        let (tx, rx) = mpsc::channel();
        let mut a = TimedRecorder::new(Some((clock, 0, tx.clone())));
        let mut b = TimedRecorder::new(Some((clock, 0, tx.clone())));
        let mut other = TimedRecorder::new(Some((clock, 1, tx)));
        // Interval 0: [1000, 1100) ms, 1: [1100, 1200), 3: [1300, 1400).
        a.record(1_000 * MS, 5);
        a.record(1_099 * MS, 7);
        b.record(1_050 * MS, 9);
        a.record(1_150 * MS, 11);
        b.record(1_399 * MS, 13);
        other.record(1_000 * MS, 1);
        let mut log = IntervalLog::new(
            &["x", "y"],
            SystemTime::UNIX_EPOCH,
            clock,
            Duration::from_millis(200),
        );
        a.tick(1_250 * MS); // hands interval 1 over
        let early: Vec<Piece> = rx.try_iter().collect();
        assert_eq!(early.len(), 3, "a's intervals 0 and 1, b's 0");
        early.into_iter().for_each(|p| log.absorb(p));
        let (a, b, other) = (a.finish(), b.finish(), other.finish());
        assert_eq!((a.count(), b.count(), other.count()), (3, 2, 1));
        for piece in rx.try_iter() {
            log.absorb(piece);
        }
        log.close(1_350 * MS);
        log.pack_before(1);
        assert_eq!(log.total_count(0), 5);
        assert_eq!(log.total_count(1), 1);

        let temp = tempfile::tempdir().unwrap();
        let dir = temp.path();
        let files = write_hlogs(dir, &[&log]).unwrap();
        assert_eq!(files[0], ("x".to_string(), "x.hlog".to_string()));
        let text = fs::read(dir.join("x.hlog")).unwrap();
        let y = fs::read(dir.join("y.hlog")).unwrap();
        let rendered = String::from_utf8_lossy(&text);
        assert!(
            rendered.starts_with("#[Logged with leasemq-loadgen"),
            "{rendered}"
        );
        assert!(rendered.contains("#[BaseTime: "), "{rendered}");

        let intervals = read_back(&text);
        let counts: Vec<u64> = intervals.iter().map(|i| i.3.len()).collect();
        // Intervals 0..=3, interval 2 written empty.
        assert_eq!(counts, [3, 1, 0, 1]);
        let starts: Vec<u64> = intervals.iter().map(|i| i.1.as_millis() as u64).collect();
        assert_eq!(starts, [0, 100, 200, 300]);
        let lengths: Vec<u64> = intervals.iter().map(|i| i.2.as_millis() as u64).collect();
        assert_eq!(
            lengths,
            [100, 100, 100, 50],
            "the last is cut where recording stopped"
        );
        assert!(intervals.iter().all(|i| i.0.is_none()));
        assert_eq!(intervals[0].3.max(), 9);
        // The window is two intervals long: y, with one value, still has both.
        let y: Vec<u64> = read_back(&y).iter().map(|i| i.3.len()).collect();
        assert_eq!(y, [1, 0]);
    }

    #[test]
    fn differ_splits_whole_run_recorders() {
        let clock = IntervalClock::new(0, Duration::from_nanos(10));
        let mut log = IntervalLog::new(&["r"], SystemTime::now(), clock, Duration::ZERO);
        log.set_tag("step-1");
        let mut differ = Differ::new(clock, 1);
        let mut rec = Recorder::new();
        rec.record(3);
        rec.record(4);
        assert!(!differ.due(9));
        assert!(differ.due(10));
        differ.take(10, &[&rec], &mut log);
        rec.record(5);
        // Nothing due yet, then two intervals pass at once: the value goes to interval 1.
        assert!(!differ.due(19));
        differ.take(35, &[&rec], &mut log);
        rec.record(6);
        differ.take(36, &[&rec], &mut log);
        assert_eq!(log.total_count(0), rec.count());
        let mut buf = Vec::new();
        let temp = tempfile::tempdir().unwrap();
        let dir = temp.path();
        write_hlogs(dir, &[&log]).unwrap();
        buf.extend(fs::read(dir.join("r.hlog")).unwrap());
        let intervals = read_back(&buf);
        let counts: Vec<u64> = intervals.iter().map(|i| i.3.len()).collect();
        assert_eq!(counts, [2, 1, 0, 1]);
        assert!(intervals.iter().all(|i| i.0.as_deref() == Some("step-1")));
    }

    #[test]
    fn late_pieces_reopen_a_packed_interval() {
        let clock = IntervalClock::new(0, Duration::from_secs(1));
        let mut log = IntervalLog::new(&["r"], SystemTime::now(), clock, Duration::ZERO);
        let mut h = Histogram::new_from(Recorder::new().histogram());
        h.record(10).unwrap();
        log.add(0, 0, &h);
        log.pack_before(5);
        log.add(0, 0, &h);
        assert_eq!(log.total_count(0), 2);
        assert_eq!(log.index_at(2_500_000_000), 2);
    }
}
