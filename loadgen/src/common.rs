//! What both workloads share: the clock, message bodies, queue names and the ledger that
//! checks every message was acked exactly once.

use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use leasemq::{shard_for, Broker, Error, QueueStats};

/// How close to a due time [`Clock::wait_until`] stops sleeping and spins.
const SPIN_BEFORE_DUE_NS: u64 = 60_000;

/// Nanoseconds since one `Instant` shared by every thread of a run.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    epoch: Instant,
}

impl Clock {
    pub fn start() -> Clock {
        Clock {
            epoch: Instant::now(),
        }
    }

    #[inline]
    pub fn now_ns(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Waits until `at_ns`: sleeps while far away, then spins for the last stretch, which
    /// a sleep would overshoot (the kernel's default timer slack is 50 µs). Never yields:
    /// beside busy threads a yield can hand a whole time slice to one of them.
    pub fn wait_until(&self, at_ns: u64) {
        loop {
            let now = self.now_ns();
            if now >= at_ns {
                return;
            }
            let left = at_ns - now;
            if left > SPIN_BEFORE_DUE_NS {
                std::thread::sleep(Duration::from_nanos(left - SPIN_BEFORE_DUE_NS));
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

pub fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Builds message bodies: the send time (nanoseconds since the run's epoch) in bytes 0..8,
/// a sequence number in bytes 8..16 (little endian), zeros after. Bodies are cut from one
/// larger buffer, so a batch costs one allocation, not one per message.
pub struct BodyWriter {
    size: usize,
    buf: BytesMut,
}

/// Body bytes used by the header; bodies are at least this long.
pub const HEADER_BYTES: usize = 16;

impl BodyWriter {
    pub fn new(size: usize) -> BodyWriter {
        assert!(size >= HEADER_BYTES, "bodies carry a 16-byte header");
        BodyWriter {
            size,
            buf: BytesMut::new(),
        }
    }

    pub fn body(&mut self, sent_ns: u64, seq: u64) -> Bytes {
        if self.buf.capacity() < self.size {
            self.buf.reserve((self.size * 256).max(64 * 1024));
        }
        self.buf.put_u64_le(sent_ns);
        self.buf.put_u64_le(seq);
        self.buf.put_bytes(0, self.size - HEADER_BYTES);
        self.buf.split().freeze()
    }
}

/// Reads the send time and sequence number back out of a body.
#[inline]
pub fn read_header(body: &[u8]) -> Option<(u64, u64)> {
    let sent = u64::from_le_bytes(body.get(0..8)?.try_into().ok()?);
    let seq = u64::from_le_bytes(body.get(8..16)?.try_into().ok()?);
    Some((sent, seq))
}

/// `count` queue names starting with `prefix`, queue i on shard i mod `shards`.
pub fn queue_names(prefix: &str, count: usize, shards: usize) -> Vec<String> {
    (0..count)
        .map(|i| {
            let want = i % shards;
            (0u32..)
                .map(|k| format!("{prefix}.{i}.{k}"))
                .find(|name| shard_for(name, shards) == want)
                .expect("some name lands on every shard")
        })
        .collect()
}

/// A fixed, well-mixed hash of a sequence number (splitmix64).
#[inline]
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// True for about `fraction` of all `x`, always the same ones.
#[inline]
pub fn chosen(x: u64, threshold: u64) -> bool {
    mix(x) < threshold
}

/// The `chosen` threshold for a fraction in [0, 1].
pub fn threshold(fraction: f64) -> u64 {
    if fraction >= 1.0 {
        u64::MAX
    } else {
        (fraction * u64::MAX as f64) as u64
    }
}

/// Which sequence numbers were acked, one bit each, per producer. Each thread keeps its own;
/// they are merged at the end, and a bit set twice is a double ack.
#[derive(Clone, Debug, Default)]
pub struct Ledger {
    producers: Vec<Vec<u64>>,
    /// Acks of a sequence number this ledger had already seen.
    pub doubles: u64,
}

/// Sequence numbers carry the producer in their top 24 bits.
pub const SEQ_BITS: u32 = 40;

pub fn seq_of(producer: u64, local: u64) -> u64 {
    (producer << SEQ_BITS) | local
}

impl Ledger {
    /// Marks `seq` acked; counts a double if it already was.
    #[inline]
    pub fn mark(&mut self, seq: u64) {
        let producer = (seq >> SEQ_BITS) as usize;
        let local = seq & ((1 << SEQ_BITS) - 1);
        if self.producers.len() <= producer {
            self.producers.resize_with(producer + 1, Vec::new);
        }
        let words = &mut self.producers[producer];
        let word = (local / 64) as usize;
        if words.len() <= word {
            let grow = (word + 1).max(words.len() * 2);
            words.resize(grow, 0);
        }
        let bit = 1u64 << (local % 64);
        if words[word] & bit != 0 {
            self.doubles += 1;
        }
        words[word] |= bit;
    }

    /// Folds `other` in; a sequence number both saw counts as a double.
    pub fn merge(&mut self, other: &Ledger) {
        self.doubles += other.doubles;
        if self.producers.len() < other.producers.len() {
            self.producers.resize_with(other.producers.len(), Vec::new);
        }
        for (mine, theirs) in self.producers.iter_mut().zip(&other.producers) {
            if mine.len() < theirs.len() {
                mine.resize(theirs.len(), 0);
            }
            for (a, b) in mine.iter_mut().zip(theirs) {
                self.doubles += u64::from((*a & *b).count_ones());
                *a |= *b;
            }
        }
    }

    /// How many of producer `p`'s first `put` sequence numbers are missing, and how many
    /// numbers beyond them (never put) were acked.
    pub fn check(&self, p: usize, put: u64) -> (u64, u64) {
        let words = self.producers.get(p).map_or(&[][..], Vec::as_slice);
        let mut seen_below = 0u64;
        let mut beyond = 0u64;
        for (i, &w) in words.iter().enumerate() {
            let base = i as u64 * 64;
            let below = if base + 64 <= put {
                u64::MAX
            } else if base >= put {
                0
            } else {
                (1u64 << (put - base)) - 1
            };
            seen_below += u64::from((w & below).count_ones());
            beyond += u64::from((w & !below).count_ones());
        }
        (put - seen_below, beyond)
    }
}

/// The sum of several queues' stats.
pub fn add_stats(total: &mut QueueStats, s: &QueueStats) {
    total.ready += s.ready;
    total.delayed += s.delayed;
    total.leased += s.leased;
    total.consumers += s.consumers;
    total.enqueued += s.enqueued;
    total.duplicates += s.duplicates;
    total.delivered += s.delivered;
    total.acked += s.acked;
    total.nacked += s.nacked;
    total.rejected += s.rejected;
    total.released += s.released;
    total.expired += s.expired;
    total.dead_lettered += s.dead_lettered;
    total.dropped += s.dropped;
    total.stale += s.stale;
}

/// A broker with `shards` shard threads and the default settings.
pub fn new_broker(shards: u32) -> Result<Broker, String> {
    crate::scheduling::broker(Broker::builder().shards(shards as usize))
        .build()
        .map_err(|e| broker_error("starting the broker", e))
}

/// Turns a broker error into the message the run fails with.
pub fn broker_error(what: &str, e: Error) -> String {
    format!("{what}: {e}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_carry_time_and_sequence() {
        let mut w = BodyWriter::new(64);
        let a = w.body(123, seq_of(2, 7));
        let b = w.body(456, 8);
        assert_eq!(a.len(), 64);
        assert_eq!(read_header(&a), Some((123, seq_of(2, 7))));
        assert_eq!(read_header(&b), Some((456, 8)));
        assert!(a[16..].iter().all(|&x| x == 0));
        assert_eq!(read_header(b"short"), None);
    }

    #[test]
    fn ledger_finds_missing_and_doubles() {
        let mut a = Ledger::default();
        let mut b = Ledger::default();
        for i in 0..100 {
            if i % 2 == 0 {
                a.mark(seq_of(1, i));
            } else {
                b.mark(seq_of(1, i));
            }
        }
        a.mark(seq_of(0, 0));
        a.merge(&b);
        assert_eq!(a.doubles, 0);
        assert_eq!(a.check(1, 100), (0, 0));
        assert_eq!(a.check(1, 101), (1, 0));
        assert_eq!(a.check(1, 99), (0, 1));
        assert_eq!(a.check(0, 1), (0, 0));
        assert_eq!(a.check(5, 3), (3, 0));
        let mut c = Ledger::default();
        c.mark(seq_of(1, 5));
        c.mark(seq_of(1, 5));
        assert_eq!(c.doubles, 1);
        a.merge(&c);
        assert_eq!(a.doubles, 2);
    }

    #[test]
    fn queues_land_on_the_shard_asked_for() {
        let names = queue_names("tp", 5, 2);
        for (i, name) in names.iter().enumerate() {
            assert_eq!(shard_for(name, 2), i % 2, "{name}");
        }
        assert_eq!(names.len(), 5);
    }

    #[test]
    fn chosen_fraction_is_close() {
        let t = threshold(0.01);
        let n = (0..100_000u64).filter(|&x| chosen(x, t)).count();
        assert!((800..1200).contains(&n), "{n}");
        assert_eq!(
            (0..1000u64).filter(|&x| chosen(x, threshold(0.0))).count(),
            0
        );
        assert_eq!(
            (0..1000u64).filter(|&x| chosen(x, threshold(1.0))).count(),
            1000
        );
    }
}
