//! A leader's proposals: its batches written to its group in order, and each one's
//! outcome, in the same order, as soon as it is known.
//!
//! A batch is committed once a majority of the group holds it durably; openraft says so
//! before the batch is applied anywhere, and the leader lets out what waited on it then.
//! When openraft gives up on a batch without committing it (this node stopped leading
//! under the leader id it was proposed under, its lease ran out, a leadership transfer
//! began, the replica stopped), the batch may still be in the log, and a later leader
//! may commit it: its fate is unknown. So is the fate of every later batch of the chain,
//! even one openraft then commits: replicas apply it only if they applied the one before
//! (the chain rule, `replay.rs`). The leader answers what waited on them `Unavailable`,
//! and rebuilds from what its group applied.

use std::collections::VecDeque;

use openraft::impls::ProgressResponder;
use tokio::sync::mpsc;
use tokio::sync::oneshot::error::TryRecvError::Empty;

use crate::{Applier, Batch, LogId, Raft};

/// What became of a proposal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Batch `p` is committed, at this log id.
    Committed {
        /// The batch's number in its chain.
        p: u64,
        /// Where it is in the log.
        log_id: LogId,
    },
    /// Batch `p` may or may not be applied: openraft gave up on it or on one before it
    /// in the chain.
    Unknown {
        /// The batch's number in its chain.
        p: u64,
    },
}

/// Proposes a leader's batches on its replica. Dropping it stops taking batches; those
/// handed over still get their outcomes.
pub struct Proposer {
    batches: mpsc::UnboundedSender<Batch>,
}

impl Proposer {
    /// Starts proposing on `raft`, as the leader `leader` (term, node): every batch is
    /// written only while this replica leads under that id. `report` hears each batch's
    /// outcome, in the order the batches were proposed; it runs on the runtime's tasks, so
    /// keep it short (hand the outcome over and wake the shard).
    pub fn start<A: Applier>(
        raft: Raft<A>,
        leader: (u64, u64),
        report: impl Fn(Outcome) + Send + Sync + 'static,
        runtime: &tokio::runtime::Handle,
    ) -> Proposer {
        let (batches, mut to_write) = mpsc::unbounded_channel::<Batch>();
        let (written, mut to_resolve) = mpsc::unbounded_channel();
        let leader_id = openraft::impls::leader_id_adv::LeaderId {
            term: leader.0,
            node_id: leader.1,
        };
        runtime.spawn(async move {
            while let Some(batch) = to_write.recv().await {
                let p = batch.p;
                let (responder, committed, completed) = ProgressResponder::new();
                let write = raft
                    .write(batch)
                    .with_leader(leader_id)
                    .responder(responder);
                // A replica that stopped (fatal) drops the responder: unknown, below.
                let _ = write.await;
                if written.send((p, committed, completed)).is_err() {
                    break;
                }
            }
        });
        runtime.spawn(async move {
            // Completions (applied, or failed) come after commits; they are held only so
            // that openraft finds someone to tell, and let go once told.
            let mut completing = VecDeque::new();
            let mut broken = false;
            while let Some((p, committed, completed)) = to_resolve.recv().await {
                let outcome = match committed.await {
                    Ok(log_id) if !broken => Outcome::Committed { p, log_id },
                    Ok(_) => Outcome::Unknown { p },
                    Err(_) => {
                        broken = true;
                        Outcome::Unknown { p }
                    }
                };
                report(outcome);
                completing.push_back(completed);
                completing.retain_mut(|c| c.try_recv().is_err_and(|e| e == Empty));
            }
        });
        Proposer { batches }
    }

    /// Hands a batch over to be proposed; false once the proposer stopped (its replica
    /// is gone).
    pub fn propose(&self, batch: Batch) -> bool {
        self.batches.send(batch).is_ok()
    }
}
