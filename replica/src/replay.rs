//! A follower's copy of a shard: an engine restoring what the group committed, batch by
//! batch, under the chain rule.
//!
//! A leader runs ahead of commit: it computes each turn's changes on top of the last
//! turn's before either is committed. openraft may refuse a proposal while the leader
//! stays leader (its lease ran out, a transfer is under way) and accept the next one,
//! which was computed on top of the refused one. So every batch names its place in its
//! leader's chain of proposals, `(inc, p)` under the entry's leader id, and every replica
//! applies the same rule: a batch of the current chain only if it is the next one
//! (`p = last + 1`), a batch of a newer chain only if it is that chain's first (`p = 1`);
//! anything else is skipped. A leader whose proposal was refused rebuilds its engine from
//! what was committed and starts a new chain (`inc + 1`), whose first batch comes after
//! every batch of the broken one. The chain is part of every image.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use leasemq_engine::durable::begin_batch;
use leasemq_engine::{Effects, Shard};

use crate::{invalid, Applied, Applier};

/// Where the chain of applied batches stands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Chain {
    /// The leader whose chain it is: its term and node; `(0, 0)` before any batch.
    pub leader: (u64, u64),
    /// The chain's incarnation under that leader.
    pub inc: u32,
    /// The last batch applied from it.
    pub last: u64,
}

impl Chain {
    /// Whether the batch `(inc, p)` proposed by `leader` follows the chain, which then
    /// moves on to it.
    pub fn admit(&mut self, leader: (u64, u64), inc: u32, p: u64) -> bool {
        let (ours, theirs) = ((self.leader, self.inc), (leader, inc));
        let follows = if theirs == ours {
            p == self.last + 1
        } else {
            theirs > ours && p == 1
        };
        if follows {
            *self = Chain {
                leader,
                inc,
                last: p,
            };
        }
        follows
    }
}

/// An engine that restores committed batches, and its chain.
pub struct Replay {
    engine: Shard,
    chain: Chain,
    index: u16,
    tick: Duration,
}

/// The image's header: the chain (term, node, inc, last) before the engine's changes.
const CHAIN_BYTES: usize = 8 + 8 + 4 + 8;

impl Replay {
    /// A replay of shard `index` from nothing, its engine ticking every `tick`.
    pub fn new(index: u16, tick: Duration) -> Replay {
        Replay {
            engine: Shard::new(index, tick),
            chain: Chain::default(),
            index,
            tick,
        }
    }

    /// Applies a committed batch if it follows the chain; says whether it did.
    ///
    /// # Errors
    ///
    /// A batch that does not decode, or whose changes do not fit the engine: the
    /// replica's copy is then broken, and goes no further.
    pub fn apply(&mut self, applied: &Applied) -> std::io::Result<bool> {
        let leader = applied.log_id.committed_leader_id();
        let batch = &applied.batch;
        if !self
            .chain
            .admit((leader.term, leader.node_id), batch.inc, batch.p)
        {
            return Ok(false);
        }
        if !batch.changes.is_empty() {
            let index = applied.log_id.index;
            (self.engine)
                .restore_batch(Bytes::from(batch.changes.clone()))
                .map_err(|e| invalid(format!("entry {index}: {e}")))?;
        }
        Ok(true)
    }

    /// Ends the replay for a replica that takes the lead, once it applied everything
    /// its group committed: the engine's log time goes on from the later of `wall` (the
    /// new leader's clock, ns) and the last log time its changes carry, so that it never
    /// runs backwards; the shard's broker ids go on after the last it used; and the
    /// restore is finished. A message leased under the old leader is ready again, ahead
    /// of fresh ones, its attempt kept; one past its last allowed delivery is
    /// dead-lettered, in `out` as after any command. Returns the live engine and the
    /// chain of the last batch applied.
    pub fn promote(self, wall: u64, out: &mut Effects) -> (Shard, Chain) {
        let (mut engine, chain) = (self.engine, self.chain);
        let epoch = wall.max(engine.restored_clock().unwrap_or(0));
        let own = engine.restored_auto_ids().into_iter();
        let ids = own
            .filter(|&(shard, _)| shard == self.index)
            .map(|(_, seq)| seq);
        engine.reserve_auto_ids(ids.max().unwrap_or(0));
        engine.set_log_epoch(epoch);
        engine.finish_restore(out);
        (engine, chain)
    }

    /// The engine as far as the replay went.
    pub fn engine(&self) -> &Shard {
        &self.engine
    }

    /// The replay's state as bytes [`install`](Replay::install) takes: the chain, then
    /// the engine's image as one batch of changes.
    pub fn image(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(CHAIN_BYTES + 64);
        let Chain { leader, inc, last } = self.chain;
        bytes.extend_from_slice(&leader.0.to_le_bytes());
        bytes.extend_from_slice(&leader.1.to_le_bytes());
        bytes.extend_from_slice(&inc.to_le_bytes());
        bytes.extend_from_slice(&last.to_le_bytes());
        begin_batch(&mut bytes);
        self.engine.image(|change| change.encode(&mut bytes));
        bytes
    }

    /// Replaces the replay's state with an image.
    ///
    /// # Errors
    ///
    /// An image that does not decode or fit a fresh engine; the replay is then as it
    /// was.
    pub fn install(&mut self, image: &[u8]) -> std::io::Result<()> {
        let fresh = Shard::new(self.index, self.tick);
        *self = Replay::resume(fresh, image)?;
        Ok(())
    }

    /// A replay that goes on from `image` (as [`image`](Replay::image) made it) in
    /// `engine`, a fresh engine of the same shard: the way a replica that takes the lead
    /// makes its live engine, set up as its runtime needs it (a real clock's slack, key
    /// generations after its last engine's), from its group's copy.
    ///
    /// # Errors
    ///
    /// An image that does not decode or fit the engine.
    pub fn resume(mut engine: Shard, image: &[u8]) -> std::io::Result<Replay> {
        if image.len() < CHAIN_BYTES {
            return Err(invalid(format!("an image of {} bytes", image.len())));
        }
        let u64_at = |at: usize| u64::from_le_bytes(image[at..at + 8].try_into().expect("8"));
        let inc = u32::from_le_bytes(image[16..20].try_into().expect("4 bytes"));
        let chain = Chain {
            leader: (u64_at(0), u64_at(8)),
            inc,
            last: u64_at(20),
        };
        let changes = Bytes::copy_from_slice(&image[CHAIN_BYTES..]);
        engine
            .restore_batch(changes)
            .map_err(|e| invalid(format!("image: {e}")))?;
        Ok(Replay {
            index: engine.index(),
            tick: engine.tick_length().as_duration(),
            engine,
            chain,
        })
    }
}

/// An [`Applier`] over a [`Replay`]: a replica's copy of a shard that only follows.
/// Clones share the same replay.
#[derive(Clone)]
pub struct ReplayApplier {
    replay: Arc<Mutex<Replay>>,
}

impl ReplayApplier {
    /// An applier over `replay`.
    pub fn new(replay: Replay) -> ReplayApplier {
        ReplayApplier {
            replay: Arc::new(Mutex::new(replay)),
        }
    }

    /// Looks at the replay.
    pub fn with<R>(&self, look: impl FnOnce(&Replay) -> R) -> R {
        look(&self.replay.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Replay> {
        self.replay.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Applier for ReplayApplier {
    async fn apply(&self, batches: Vec<Applied>) -> std::io::Result<()> {
        let mut replay = self.lock();
        for applied in &batches {
            replay.apply(applied)?;
        }
        Ok(())
    }

    async fn image(&self) -> std::io::Result<Vec<u8>> {
        Ok(self.lock().image())
    }

    async fn install(&self, image: Vec<u8>) -> std::io::Result<()> {
        self.lock().install(&image)
    }
}

#[cfg(test)]
mod tests {
    use super::Chain;

    #[test]
    fn a_chain_takes_its_next_batch_and_a_newer_chain_s_first() {
        let mut chain = Chain::default();
        let one = (1, 1);
        assert!(chain.admit(one, 0, 1));
        assert!(chain.admit(one, 0, 2));
        // A hole: batch 3 was refused, so 4 and 5, computed on top of it, are skipped.
        assert!(!chain.admit(one, 0, 4));
        assert!(!chain.admit(one, 0, 5));
        // The leader rebuilt and goes on as incarnation 1.
        assert!(chain.admit(one, 1, 1));
        assert!(!chain.admit(one, 1, 1), "a batch twice");
        // A new leader starts at 1; its chain ends every older one.
        assert!(!chain.admit((2, 3), 0, 2));
        assert!(chain.admit((2, 3), 0, 1));
        assert!(!chain.admit(one, 1, 2), "an older chain");
        assert!(
            !chain.admit(one, 2, 1),
            "an older leader's newer incarnation"
        );
        assert_eq!(
            chain,
            Chain {
                leader: (2, 3),
                inc: 0,
                last: 1
            }
        );
    }

    #[test]
    fn a_chain_whose_first_batch_was_refused_takes_none_of_it() {
        let mut chain = Chain::default();
        assert!(!chain.admit((1, 2), 0, 2));
        assert!(!chain.admit((1, 2), 0, 3));
        assert!(chain.admit((1, 2), 1, 1));
    }
}
