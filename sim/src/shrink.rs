//! Shrinking a failing trace: the shortest failing prefix, then delta debugging (Zeller &
//! Hildebrandt, 2002) by deleting chunks of ops, halving the chunk down to single ops, as
//! long as the same check still fails.

use std::time::{Duration, Instant};

use crate::fault::Fault;
use crate::op::Op;
use crate::setup::Setup;
use crate::{replay_with, Violation};

/// How long shrinking may take before it settles for what it has.
const BUDGET: Duration = Duration::from_secs(120);

/// The shortest trace found that still fails `violation`'s check, and how it fails.
pub(crate) fn shrink(
    setup: &Setup,
    fault: Option<(Fault, usize)>,
    ops: Vec<Op>,
    violation: &Violation,
) -> (Vec<Op>, Violation) {
    let started = Instant::now();
    let fails = |ops: &[Op]| match replay_with(setup, fault, ops) {
        Err((n, v)) if v.check == violation.check => Some((n, v)),
        _ => None,
    };
    // The run fails at its last op: replaying that prefix must fail the same way.
    let Some((n, mut last)) = fails(&ops) else {
        let note = Violation::new(
            "not-reproduced",
            "replaying the trace did not fail again: the simulation is not deterministic",
        );
        return (ops, note);
    };
    let mut ops = ops;
    ops.truncate(n);
    let mut chunk = (ops.len() / 2).max(1);
    loop {
        let mut progress = false;
        let mut i = 0;
        while i < ops.len() {
            if started.elapsed() > BUDGET {
                return (ops, last);
            }
            let end = (i + chunk).min(ops.len());
            let candidate: Vec<Op> = ops[..i].iter().chain(&ops[end..]).cloned().collect();
            match fails(&candidate) {
                Some((n, v)) => {
                    ops = candidate;
                    ops.truncate(n);
                    last = v;
                    progress = true;
                }
                None => i += chunk,
            }
        }
        if chunk > 1 {
            chunk /= 2;
        } else if !progress {
            return (ops, last);
        }
    }
}
