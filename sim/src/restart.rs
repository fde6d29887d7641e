//! A crash and a restart of the simulated broker (durable runs): everything in memory is
//! lost, the disks keep what a crash may keep, and the shards come back from their logs
//! the way `leasemq-shard`'s `BrokerBuilder::build` brings them back.

use std::collections::{HashMap, VecDeque};

use leasemq_engine::durable::Change;
use leasemq_engine::{Command, Effects, Reply, Shard};
use leasemq_shard::route;

use crate::ledger::{Restart, RestoredMsg, RestoredQueue};
use crate::rng::Rng;
use crate::storage::{self, Crashed, Disks};
use crate::world::{OnShard, World};
use crate::Violation;

/// A shard's disk and log after recovery, with the lsn [`Disks::resume`] needs.
type Recovered = (leasemq_wal::MemDisk, leasemq_wal::Wal, leasemq_wal::Lsn);

/// Ticks the broker may stay down: none, a few, past most leases and delays, past all.
const DOWNTIMES: [u64; 5] = [0, 1, 7, 60, 5_000];

impl World {
    /// Crashes the broker and restarts it from its disks; checks what came back.
    pub(crate) fn crash(&mut self, seed: u64, flip: bool) -> Result<(), Violation> {
        let Some(disks) = self.disks.take() else {
            return Ok(());
        };
        let mut rng = Rng::new(seed);
        let tick_nanos = self.setup().tick_nanos();
        let old_epoch = self.epoch;
        let crashed_at = old_epoch + self.now() * tick_nanos;
        let mut crashed = disks.crash(rng.next_u64());
        self.forget_the_process();
        if flip {
            self.damage_and_refuse(&mut crashed, &mut rng)?;
        }
        let epoch = crashed_at + rng.pick(&DOWNTIMES) * tick_nanos;
        // One start in four meets a read error on one shard's disk first.
        if rng.one_in(4) {
            let shard = rng.index(crashed.len());
            self.read_error_refuses(&crashed[shard], shard, rng.next_u64())?;
        }
        let (shards, wals) = self.recover_all(&crashed)?;
        let at = Restart {
            old_epoch,
            epoch,
            tick_nanos,
        };
        self.restart_from(shards, wals, at)
    }

    /// What lived only in the crashed process: messages between shards, what waited for
    /// a disk, unanswered calls, consumers and what they held, stale handles.
    fn forget_the_process(&mut self) {
        self.in_flight.clear();
        self.backlogs.iter_mut().for_each(route::Backlog::clear);
        self.pending.iter_mut().for_each(VecDeque::clear);
        self.held.clear();
        self.confirms.clear();
        self.durable_puts.clear();
        for c in &mut self.consumers {
            c.channel.clear();
            c.hand.clear();
        }
        self.live.clear();
        self.ended.clear();
        self.closed.iter_mut().for_each(|q| *q = None);
        self.ledger.stats.crashes += 1;
    }

    /// Flips a bit of an old record on one disk: recovery must refuse it, naming the file
    /// and the offset of the damaged record. The restart then goes on from the disk as it
    /// was before the damage (a copy of it).
    fn damage_and_refuse(
        &mut self,
        crashed: &mut [Crashed],
        rng: &mut Rng,
    ) -> Result<(), Violation> {
        let first = rng.index(crashed.len());
        for i in (0..crashed.len()).map(|i| (first + i) % crashed.len()) {
            let copy = crashed[i].disk.fork();
            let Some(flipped) = storage::flip_old_bit(&crashed[i], i, rng) else {
                continue;
            };
            let mut probe = Shard::new(i as u16, self.setup().tick);
            let refused = storage::recover(&crashed[i].disk, i, &mut probe);
            crashed[i].disk = copy;
            return match refused {
                Ok(_) => Err(Violation::new(
                    "damage-accepted",
                    format!(
                        "a bit flipped in record {} of {} (synced, with later writes after it), \
                         and recovery accepted the log",
                        flipped.lsn,
                        flipped.path.display()
                    ),
                )),
                Err(e) if !storage::names_place(&e, &flipped.path, flipped.frame) => {
                    Err(Violation::new(
                        "damage-report",
                        format!(
                            "a bit flipped in record {} of {} at byte {}; recovery said: {e}",
                            flipped.lsn,
                            flipped.path.display(),
                            flipped.frame
                        ),
                    ))
                }
                Err(_) => {
                    self.ledger.stats.refusals += 1;
                    Ok(())
                }
            };
        }
        Ok(())
    }

    /// A start whose read of one of shard `index`'s segments (picked by `pick`) fails:
    /// recovery must refuse it, and leave the disk as it was, for the next start.
    fn read_error_refuses(
        &mut self,
        crashed: &Crashed,
        index: usize,
        pick: u64,
    ) -> Result<(), Violation> {
        let segments = storage::segments_of(&crashed.disk, index);
        if segments.is_empty() {
            return Ok(());
        }
        let segment = &segments[(pick % segments.len() as u64) as usize];
        let before = storage::image_of(&crashed.disk, index);
        crashed.disk.fail_next_read(segment);
        let mut probe = Shard::new(index as u16, self.setup().tick);
        let opened = storage::recover(&crashed.disk, index, &mut probe);
        let detail = |what: &str| format!("{what} a read error in {}", segment.display());
        match opened {
            Ok(_) => Err(Violation::new(
                "read-error-accepted",
                detail("recovery opened past"),
            )),
            Err(_) if storage::image_of(&crashed.disk, index) != before => Err(Violation::new(
                "read-error-changed-disk",
                detail("recovery changed the disk though it refused"),
            )),
            Err(_) => {
                self.ledger.stats.read_errors += 1;
                Ok(())
            }
        }
    }

    /// Each shard's engine restored from its log; a torn tail is cut, a synced record
    /// never is.
    fn recover_all(
        &mut self,
        crashed: &[Crashed],
    ) -> Result<(Vec<Shard>, Vec<Recovered>), Violation> {
        let mut shards = Vec::with_capacity(crashed.len());
        let mut wals = Vec::with_capacity(crashed.len());
        for (i, c) in crashed.iter().enumerate() {
            let mut shard = Shard::new(i as u16, self.setup().tick);
            let (wal, report) = storage::recover(&c.disk, i, &mut shard).map_err(|e| {
                Violation::new(
                    "restart-refused",
                    format!("shard {i} would not recover: {e}"),
                )
            })?;
            if report.next_lsn.0 <= c.durable.0 {
                return Err(Violation::new(
                    "restart-lost-synced",
                    format!(
                        "{}: records up to {} were fsynced, recovery ended at {}",
                        storage::dir_of(i).display(),
                        c.durable,
                        report.next_lsn.0 - 1
                    ),
                ));
            }
            if report.torn.is_some() {
                self.ledger.stats.torn += 1;
            }
            shards.push(shard);
            wals.push((c.disk.clone(), wal, c.older));
        }
        Ok((shards, wals))
    }

    /// The cross-shard steps of a restart (`BrokerBuilder::build`): broker ids reserved
    /// past every restored one, the log epoch set, each restore finished; then the ledger
    /// checks what came back, and the dead letters the restore made are sent.
    fn restart_from(
        &mut self,
        mut shards: Vec<Shard>,
        wals: Vec<Recovered>,
        at: Restart,
    ) -> Result<(), Violation> {
        let mut auto_ids = vec![0u64; shards.len()];
        for shard in &shards {
            for (s, seq) in shard.restored_auto_ids() {
                if let Some(max) = auto_ids.get_mut(usize::from(s)) {
                    *max = (*max).max(seq);
                }
            }
        }
        let mut outs = Vec::with_capacity(shards.len());
        for (shard, ids) in shards.iter_mut().zip(auto_ids) {
            shard.reserve_auto_ids(ids);
            shard.set_log_epoch(at.epoch);
            let mut out = Effects::new();
            shard.finish_restore(&mut out);
            outs.push(out);
        }
        let mut restored = Vec::new();
        let mut letters = Vec::new();
        for (i, shard) in shards.iter_mut().enumerate() {
            restored.extend(restored_queues(i as u16, shard));
            letters.extend(outs[i].dead_letters.iter().map(|l| (i as u16, l.clone())));
        }
        // A message the restore dead-lettered is back in its source until the outcome.
        // Each letter is one restored message: copies of a message (a hop sent again after
        // a crash) share its body, so a letter marks a copy at the attempt it died with.
        for (shard, l) in &letters {
            let source = restored
                .iter_mut()
                .find(|r| r.shard == *shard && r.key == Some(l.origin.queue));
            let Some(r) = source else { continue };
            let unmarked = |m: &RestoredMsg| m.body == l.body && m.dying.is_none();
            let at = r
                .msgs
                .iter()
                .position(|m| unmarked(m) && m.attempt == l.death.attempts)
                .or_else(|| r.msgs.iter().position(unmarked));
            match at {
                Some(i) => r.msgs[i].dying = Some(l.origin.msg),
                None => r.msgs.push(RestoredMsg {
                    body: l.body.clone(),
                    id: l.id.clone(),
                    attempt: l.death.attempts,
                    ready_at: None,
                    dedup_until: None,
                    death: None,
                    dying: Some(l.origin.msg),
                }),
            }
        }
        self.ledger.stats.restored += restored.iter().map(|r| r.msgs.len() as u64).sum::<u64>();
        self.restart_world(shards, Disks::resume(wals), at.epoch);
        // What the restore dropped: leased at the crash after its last delivery, with no
        // dead-letter queue to go to.
        let mut dropped = Vec::new();
        for (i, out) in outs.iter().enumerate() {
            for change in &out.log {
                if let Change::Removed { queue, .. } = change {
                    dropped.push((i as u16, *queue));
                }
            }
        }
        self.ledger.restart(&restored, &dropped, at)?;
        for (i, mut out) in outs.into_iter().enumerate() {
            let mut on = OnShard::new(self, i);
            let mut changes = std::mem::take(&mut out.log);
            on.log(0, &mut changes);
            on.out.dead_letters.append(&mut out.dead_letters);
            route::dead_letters(&mut on, 0, None);
            on.finish()?;
        }
        Ok(())
    }
}

/// The durable queues a restored shard holds, from its image, with their keys.
fn restored_queues(index: u16, shard: &mut Shard) -> Vec<RestoredQueue> {
    let mut queues: Vec<RestoredQueue> = Vec::new();
    let mut by_number: HashMap<u32, usize> = HashMap::new();
    shard.image(|change| match change {
        Change::Declared {
            queue,
            name,
            config,
        } => {
            by_number.insert(queue, queues.len());
            queues.push(RestoredQueue {
                shard: index,
                number: queue,
                name: name.to_string(),
                config: *config,
                key: None,
                next_tag: 1,
                msgs: Vec::new(),
                windows: Vec::new(),
            });
        }
        Change::Tags { queue, next } => queues[by_number[&queue]].next_tag = next,
        Change::Enqueued {
            queue,
            id,
            body,
            attempt,
            ready_at,
            dedup_until,
            death,
            ..
        } => queues[by_number[&queue]].msgs.push(RestoredMsg {
            body,
            id,
            attempt,
            ready_at,
            dedup_until,
            death: death.map(|d| *d),
            dying: None,
        }),
        Change::Windowed { queue, id, until } => {
            queues[by_number[&queue]]
                .windows
                .push((id.to_string(), until));
        }
        _ => {}
    });
    for q in &mut queues {
        let mut out = Effects::new();
        let lookup = Command::Lookup {
            name: q.name.clone(),
        };
        shard.handle(0, lookup, &mut out);
        if let Some(Reply::Found(key)) = out.reply {
            q.key = key;
        }
    }
    queues
}
