//! A fuzzer's input decoded into a whole-broker run, checked as a seed's run is.
//!
//! The first 8 bytes (little-endian, zero-padded when the input is shorter) are the seed: it
//! fixes the [`Setup`] (shards, tick, names, config palettes) and the workload's mix. Every
//! later byte drives the workload generator in place of the seeded [`Rng`]: each
//! choice it makes (which kind of op, which queue, consumer, delay, settle…) takes the next
//! one or two bytes. So every input decodes into a workload the ledger can check, and a
//! fuzzer's mutation of one byte changes one choice rather than scrambling the rest. The run
//! ends when the bytes do (or after [`MAX_OPS`] ops); then everything still between shards is
//! delivered and the end state checked, as after a seed.
//!
//! ```
//! let input = [7, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 200, 17, 99, 4, 0, 250, 33];
//! let stats = leasemq_sim::fuzz::run_bytes(&input).expect("no violation");
//! assert!(stats.steps > 0);
//! ```

use std::fmt;

use crate::fault::Fault;
use crate::gen::Generator;
use crate::op::Op;
use crate::rng::{Rng, Source};
use crate::setup::Setup;
use crate::{quietly, Sim, Stats, Violation};

/// The most ops one input runs, whatever its length.
pub const MAX_OPS: usize = 4096;

/// The bytes of an input as a `Source`: `below(n)` takes as few bytes as hold `n - 1`
/// (none for `n == 1`) and reduces them modulo `n`. Once the bytes run out every draw is 0.
pub struct ByteSource<'a> {
    data: &'a [u8],
}

impl<'a> ByteSource<'a> {
    pub fn new(data: &'a [u8]) -> ByteSource<'a> {
        ByteSource { data }
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The next `n` bytes as they are; fewer when fewer are left.
    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let (head, tail) = self.data.split_at(n.min(self.data.len()));
        self.data = tail;
        head
    }

    /// The next `n` bytes (at most 8) as a little-endian number; fewer when fewer are left.
    pub fn take(&mut self, n: usize) -> u64 {
        self.bytes(n)
            .iter()
            .rev()
            .fold(0, |acc, &b| (acc << 8) | u64::from(b))
    }
}

impl Source for ByteSource<'_> {
    /// One byte, spread over 64 bits: the generator wants a whole `u64` only to seed a
    /// shuffle of the shards, where 256 choices are plenty.
    fn next_u64(&mut self) -> u64 {
        Rng::new(self.take(1)).next_u64()
    }

    fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "below(0)");
        let bits = u64::BITS - (n - 1).leading_zeros();
        let bytes = bits.div_ceil(8) as usize;
        self.take(bytes) % n
    }
}

/// The seed an input names: its first 8 bytes, little-endian, zero-padded.
pub fn seed_of(data: &[u8]) -> u64 {
    let mut seed = [0u8; 8];
    let n = data.len().min(8);
    seed[..n].copy_from_slice(&data[..n]);
    u64::from_le_bytes(seed)
}

/// An input that broke a rule: the run up to and including the op that broke it.
#[derive(Clone, Debug)]
pub struct FuzzFailure {
    pub setup: Box<Setup>,
    /// Every op run, the last one being the one that broke the rule (none when the end
    /// check broke it).
    pub trace: Vec<Op>,
    pub violation: Box<Violation>,
}

impl fmt::Display for FuzzFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "leasemq-sim: fuzz input (seed {}) broke a rule after {} ops: {}",
            self.setup.seed,
            self.trace.len(),
            self.violation
        )?;
        write!(f, "{}", self.setup)?;
        writeln!(
            f,
            "trace (consumer #n is the n-th live consumer, modulo how many there are; \
             hand[i] likewise):"
        )?;
        for (i, op) in self.trace.iter().enumerate() {
            writeln!(f, "  {:>4}. {op}", i + 1)?;
        }
        write!(f, "which fails with: {}", self.violation)
    }
}

impl std::error::Error for FuzzFailure {}

/// Decodes `data` into a run (see the module docs), carries it out and checks it after
/// every op and at the end.
pub fn run_bytes(data: &[u8]) -> Result<Stats, FuzzFailure> {
    run(data, None)
}

fn run(data: &[u8], fault: Option<(Fault, usize)>) -> Result<Stats, FuzzFailure> {
    let seed = seed_of(data);
    let setup = Setup::from_seed(seed);
    let mut sim = Sim::new(&setup, fault);
    let mut gen = Generator::with_source(seed, ByteSource::new(data.get(8..).unwrap_or(&[])));
    let mut trace = Vec::new();
    let failure = |trace: Vec<Op>, violation: Violation| FuzzFailure {
        setup: Box::new(setup.clone()),
        trace,
        violation: Box::new(violation),
    };
    while !gen.source().is_empty() && trace.len() < MAX_OPS {
        let op = match quietly(|| gen.next(&sim.world)) {
            Ok(op) => op,
            Err(v) => return Err(failure(trace, Violation::new("generator", v.detail))),
        };
        trace.push(op);
        if let Err(v) = sim.step(trace.last().expect("pushed")) {
            return Err(failure(trace, v));
        }
    }
    sim.finish().map_err(|v| failure(trace, v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_source_takes_only_the_bytes_a_choice_needs() {
        let mut s = ByteSource::new(&[5, 1, 2, 9]);
        assert_eq!(s.below(1), 0, "one choice takes no byte");
        assert_eq!(s.below(4), 1, "5 mod 4");
        assert_eq!(s.below(300), (2 << 8 | 1) % 300, "two bytes, little-endian");
        assert_eq!(s.below(10), 9);
        assert!(s.is_empty());
        assert_eq!(s.below(10), 0, "exhausted: every draw is 0");
    }

    #[test]
    fn every_input_runs_clean() {
        // A few arbitrary inputs, short and long: each decodes into a run that passes.
        let mut rng = Rng::new(11);
        for len in [0, 3, 8, 9, 40, 500, 3000] {
            let data: Vec<u8> = (0..len).map(|_| rng.below(256) as u8).collect();
            if let Err(f) = run_bytes(&data) {
                panic!("{f}");
            }
        }
    }

    #[test]
    fn byte_driven_runs_catch_planted_faults() {
        // The decoded workloads reach far enough for every planted bug to be caught.
        let mut rng = Rng::new(5);
        for fault in Fault::ALL {
            let caught = (0..60).find_map(|_| {
                let data: Vec<u8> = (0..2000).map(|_| rng.below(256) as u8).collect();
                run(&data, Some((fault, 1))).err()
            });
            let failure = caught.unwrap_or_else(|| panic!("{fault:?} went unnoticed"));
            assert!(
                fault.caught_by().contains(&failure.violation.check),
                "{fault:?} was caught by {}",
                failure.violation
            );
        }
    }

    #[test]
    fn the_same_bytes_run_the_same_ops() {
        let data: Vec<u8> = (0..400u32).map(|i| (i * 37 % 251) as u8).collect();
        assert_eq!(run_bytes(&data).ok(), run_bytes(&data).ok());
    }
}
