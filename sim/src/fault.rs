//! Planted bugs, to show that the checks can fail.
//!
//! A [`Fault`] tampers with what one engine call returned (as a buggy engine would have
//! answered) or with the ledger itself, once, at the first chance after a given step. A
//! run with a fault must fail; the tests assert that it does, and with which check.

use leasemq_engine::{DeliveryTag, Effects, Reply};

/// A bug to plant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// A delivery goes out a second time, under the next tag, while its lease is live.
    DuplicateDelivery,
    /// A delivery carries the tag of the delivery before it.
    ReusedTag,
    /// A delivery's attempt is one too high.
    WrongAttempt,
    /// A delivery the engine made never shows in the effects.
    LostDelivery,
    /// A stale settle answers `true`.
    StaleSettleSucceeds,
    /// A dead letter's death record counts one attempt too many.
    WrongDeathRecord,
    /// The ledger forgets a ready message (a tampered ledger, not a tampered engine).
    ForgetMessage,
}

impl Fault {
    pub const ALL: [Fault; 7] = [
        Fault::DuplicateDelivery,
        Fault::ReusedTag,
        Fault::WrongAttempt,
        Fault::LostDelivery,
        Fault::StaleSettleSucceeds,
        Fault::WrongDeathRecord,
        Fault::ForgetMessage,
    ];

    /// The checks that may catch it first.
    pub fn caught_by(self) -> &'static [&'static str] {
        match self {
            Fault::DuplicateDelivery => &["lease-overlap"],
            Fault::ReusedTag => &["tag-order"],
            Fault::WrongAttempt => &["attempt"],
            // Within one call the ledger matches deliveries to due messages in order, so the
            // next delivery may stand in for the lost one and show a wrong attempt.
            Fault::LostDelivery => &["missing-delivery", "attempt"],
            Fault::StaleSettleSucceeds => &["reply"],
            Fault::WrongDeathRecord => &["dead-letter"],
            Fault::ForgetMessage => &["stats"],
        }
    }
}

/// A fault and whether it has struck yet.
#[derive(Clone, Debug)]
pub(crate) struct FaultState {
    pub fault: Fault,
    /// It strikes at the first chance at or after this step.
    pub from_step: usize,
    pub struck: bool,
}

impl FaultState {
    pub fn new(fault: Fault, from_step: usize) -> FaultState {
        FaultState {
            fault,
            from_step,
            struck: false,
        }
    }

    /// Tampers with one engine call's effects, if this fault does that and its time came.
    pub fn tamper(&mut self, step: usize, out: &mut Effects) {
        if self.struck || step < self.from_step {
            return;
        }
        self.struck = match self.fault {
            Fault::DuplicateDelivery => match out.deliveries.last() {
                Some((key, d)) => {
                    let mut again = d.clone();
                    again.tag = DeliveryTag(d.tag.0 + 1);
                    out.deliveries.push((*key, again));
                    true
                }
                None => false,
            },
            Fault::ReusedTag => match out.deliveries.iter_mut().find(|(_, d)| d.tag.0 > 1) {
                Some((_, d)) => {
                    d.tag = DeliveryTag(d.tag.0 - 1);
                    true
                }
                None => false,
            },
            Fault::WrongAttempt => match out.deliveries.first_mut() {
                Some((_, d)) => {
                    d.attempt += 1;
                    true
                }
                None => false,
            },
            Fault::LostDelivery => {
                if out.deliveries.is_empty() {
                    false
                } else {
                    out.deliveries.remove(0);
                    true
                }
            }
            Fault::StaleSettleSucceeds => match &mut out.reply {
                Some(Reply::Settled(ok)) if !*ok => {
                    *ok = true;
                    true
                }
                _ => false,
            },
            Fault::WrongDeathRecord => match out.dead_letters.first_mut() {
                Some(letter) => {
                    letter.death.attempts += 1;
                    true
                }
                None => false,
            },
            Fault::ForgetMessage => false,
        };
    }

    /// Whether the ledger should forget a message now.
    pub fn forget_now(&self, step: usize) -> bool {
        self.fault == Fault::ForgetMessage && !self.struck && step >= self.from_step
    }
}
