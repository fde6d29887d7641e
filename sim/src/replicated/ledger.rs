//! What a replicated run must see: every message by its body (each put has a body of
//! its own), what was answered about it, and every delivery handed to a consumer.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;

use crate::Violation;

#[derive(Default)]
struct Msg {
    /// The put was answered (committed); else its outcome is unknown.
    answered: bool,
    /// The log time before which it may not be delivered (its delay's end).
    due: u64,
    /// The attempt of its last delivery; 0 before the first.
    attempt: u32,
    /// The attempt an answered ack settled.
    acked: Option<u32>,
    /// An ack of it went out whose outcome is unknown (its lead ended first).
    ack_unknown: bool,
}

#[derive(Default)]
pub struct Ledger {
    msgs: BTreeMap<Bytes, Msg>,
    /// Every delivery tag given, by queue.
    tags: BTreeSet<(usize, u64)>,
}

impl Ledger {
    /// A put of `body` went to the lead, not to be delivered before log time `due`.
    pub fn put_sent(&mut self, body: &Bytes, due: u64) {
        self.msgs.insert(
            body.clone(),
            Msg {
                due,
                ..Msg::default()
            },
        );
    }

    pub fn put_answered(&mut self, body: &Bytes) {
        if let Some(msg) = self.msgs.get_mut(body) {
            msg.answered = true;
        }
    }

    /// A delivery of `body` from queue `q` under `tag`, the message's `attempt`th, at log
    /// time `log_time`, was handed to its consumer after its batch was committed.
    pub fn delivered(
        &mut self,
        q: usize,
        tag: u64,
        body: &Bytes,
        attempt: u32,
        log_time: u64,
    ) -> Result<(), Violation> {
        let shown = String::from_utf8_lossy(body);
        let Some(msg) = self.msgs.get_mut(body) else {
            return Err(Violation::new(
                "unexpected",
                format!("{shown} was never put"),
            ));
        };
        if let Some(acked) = msg.acked {
            return Err(Violation::new(
                "acked-redelivered",
                format!("{shown} delivered (attempt {attempt}) after an answered ack of attempt {acked}"),
            ));
        }
        if attempt <= msg.attempt {
            return Err(Violation::new(
                "attempt",
                format!(
                    "{shown} delivered at attempt {attempt} after attempt {}",
                    msg.attempt
                ),
            ));
        }
        if log_time < msg.due {
            return Err(Violation::new(
                "delay",
                format!(
                    "{shown} delivered at log time {log_time}, due at {}",
                    msg.due
                ),
            ));
        }
        if !self.tags.insert((q, tag)) {
            return Err(Violation::new(
                "tag",
                format!("queue {q} gave tag {tag} twice ({shown})"),
            ));
        }
        msg.attempt = attempt;
        Ok(())
    }

    /// An ack of `body`'s delivery `attempt` was answered `true`.
    pub fn acked(&mut self, body: &Bytes, attempt: u32) {
        if let Some(msg) = self.msgs.get_mut(body) {
            msg.acked = Some(attempt);
        }
    }

    pub fn ack_unknown(&mut self, body: &Bytes) {
        if let Some(msg) = self.msgs.get_mut(body) {
            msg.ack_unknown = true;
        }
    }

    /// Whether every answered put is acked, or in an ack whose outcome is unknown.
    pub fn all_settled(&self) -> bool {
        self.msgs
            .values()
            .all(|m| !m.answered || m.acked.is_some() || m.ack_unknown)
    }

    /// R1/R2: no answered put was lost.
    pub fn final_check(&self) -> Result<(), Violation> {
        let lost: Vec<String> = (self.msgs.iter())
            .filter(|(_, m)| m.answered && m.acked.is_none() && !m.ack_unknown)
            .map(|(body, m)| {
                format!(
                    "{} (last attempt {})",
                    String::from_utf8_lossy(body),
                    m.attempt
                )
            })
            .collect();
        if lost.is_empty() {
            return Ok(());
        }
        Err(Violation::new(
            "lost",
            format!(
                "{} answered puts never acked after the drain: {}",
                lost.len(),
                lost.join(", ")
            ),
        ))
    }
}
