//! Whole-broker simulation from arbitrary bytes: the first 8 bytes pick the seed (shards,
//! tick, queue names, config palettes, op mix), every later byte one choice of the workload
//! generator, and the simulator's ledger checks every invariant after every op
//! (`leasemq_sim::fuzz`). A broken rule panics with the violation and the op trace.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(failure) = leasemq_sim::fuzz::run_bytes(data) {
        panic!("{failure}");
    }
});
