//! The workload and the faults of a replicated run, and its end: every fault healed, the
//! queues drained, the replicas compared.

use std::time::Duration;

use bytes::Bytes;
use leasemq_engine::{Command, Message, Reply, Settle};
use openraft::AsyncRuntime;
use openraft_rt_sim::SimRuntime;

use super::{raft, World, MAX_RETRY, NODES, SETTLE, TICK};
use crate::Violation;

impl World {
    /// A put of a new message to a queue, one in eight delayed by up to two seconds.
    pub(super) async fn put(&mut self) -> Result<(), Violation> {
        let Some(lead) = self.lead.as_ref() else {
            return Ok(());
        };
        let Some(&queue) = lead.queues.get(self.rng.index(lead.queues.len().max(1))) else {
            return Ok(());
        };
        self.next_body += 1;
        let body = Bytes::from(format!("m{}", self.next_body));
        let mut message = Message::new(body.clone());
        let mut delay = 0;
        if self.rng.one_in(8) {
            delay = self.rng.range(1, 2_000);
            message = message.with_delay(Duration::from_millis(delay));
        }
        let now = self.now();
        let lead = self.lead.as_ref().expect("leads");
        let due = lead.engine.log_time(now) + delay * 1_000_000;
        self.ledger.put_sent(&body, due);
        if self.planted {
            self.ledger.put_answered(&body);
        }
        self.summary.puts += 1;
        match self.turn(Some(Command::Put { queue, message })).await? {
            Some(Reply::Put(Ok(_))) => self.ledger.put_answered(&body),
            Some(Reply::Put(Err(e))) => {
                return Err(Violation::new("put", format!("refused: {e:?}")));
            }
            _ => {}
        }
        Ok(())
    }

    /// Settles a delivery in hand (`Ack` or `Nack`).
    pub(super) async fn settle(&mut self, op: Settle) -> Result<(), Violation> {
        let Some(lead) = self.lead.as_mut() else {
            return Ok(());
        };
        if lead.held.is_empty() {
            return Ok(());
        }
        let (q, tag, body, attempt) = lead.held.swap_remove(self.rng.index(lead.held.len()));
        let queue = lead.queues[q];
        match self.turn(Some(Command::Settle { queue, tag, op })).await? {
            Some(Reply::Settled(true)) if op == Settle::Ack => {
                self.ledger.acked(&body, attempt);
                self.summary.acks += 1;
            }
            Some(_) => {}
            None if op == Settle::Ack => self.ledger.ack_unknown(&body),
            None => {}
        }
        Ok(())
    }

    /// Lets `ms` of simulated time pass (the group's heartbeats and elections run), then
    /// fires the lead's timers.
    pub(super) async fn pass(&mut self, ms: u64) -> Result<(), Violation> {
        SimRuntime::sleep(Duration::from_millis(ms)).await;
        self.follow().await?;
        self.turn(None).await?;
        Ok(())
    }

    /// Crashes a replica (the leader more often than not) or restarts one that is down.
    pub(super) async fn crash_or_restart(&mut self) {
        let down: Vec<u64> = NODES
            .iter()
            .copied()
            .filter(|id| self.nodes[id].up.is_none())
            .collect();
        if !down.is_empty() && (down.len() > 1 || self.rng.one_in(2)) {
            let id = self.rng.pick(&down);
            self.restart(id).await;
            return;
        }
        let leader = self.lead.as_ref().map(|l| l.node);
        let id = match leader {
            Some(id) if self.rng.percent(60) => id,
            _ => self.rng.pick(&NODES),
        };
        if self.nodes[&id].up.is_some() {
            self.crash(id).await;
        }
    }

    async fn crash(&mut self, id: u64) {
        if self.lead.as_ref().is_some_and(|l| l.node == id) {
            self.stand_down();
        }
        self.net.down(id);
        if let Some((raft, _)) = self.nodes.get_mut(&id).and_then(|n| n.up.take()) {
            let _ = raft.shutdown().await;
        }
        self.summary.crashes += 1;
        SimRuntime::sleep(SETTLE).await;
    }

    async fn restart(&mut self, id: u64) {
        let disk = self.nodes[&id].disk.clone();
        let up = raft::start(id, &disk, &self.net, TICK).await;
        self.nodes.get_mut(&id).expect("a node").up = Some(up);
        SimRuntime::sleep(SETTLE).await;
    }

    /// Cuts two replicas apart, or joins every cut again.
    pub(super) fn cut_or_heal(&mut self) {
        if self.rng.one_in(2) {
            self.net.heal();
            return;
        }
        let a = self.rng.pick(&NODES);
        let b = self.rng.pick(&NODES);
        if a != b {
            self.net.cut(a, b);
            self.summary.cuts += 1;
        }
    }

    /// Heals every fault, then acks what comes until every answered put is acked, or
    /// nothing more comes; checks the ledger and that every replica holds the same copy.
    pub(super) async fn drain(&mut self) -> Result<(), Violation> {
        self.net.heal();
        for id in NODES {
            if self.nodes[&id].up.is_none() {
                self.restart(id).await;
            }
        }
        let mut quiet = 0;
        while quiet < 10 && !self.ledger.all_settled() {
            let before = self.summary.deliveries;
            // Past the longest retry delay once nothing comes.
            let ms = if quiet < 3 {
                500
            } else {
                MAX_RETRY.as_millis() as u64 + 500
            };
            self.pass(ms).await?;
            while self.lead.as_ref().is_some_and(|l| !l.held.is_empty()) {
                self.settle(Settle::Ack).await?;
            }
            quiet = if self.summary.deliveries == before {
                quiet + 1
            } else {
                0
            };
        }
        self.ledger.final_check()?;
        self.same_copies().await
    }

    /// Once every replica applied the whole log, their copies are the same bytes.
    async fn same_copies(&mut self) -> Result<(), Violation> {
        SimRuntime::sleep(SETTLE).await;
        let mut copies = Vec::new();
        for id in NODES {
            let (_, machine) = self.nodes[&id].up.as_ref().expect("up after the drain");
            let image = machine
                .replay
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .image();
            copies.push((id, machine.applied(), image));
        }
        let (first, applied, image) = &copies[0];
        for (id, their_applied, theirs) in &copies[1..] {
            if their_applied != applied || theirs != image {
                return Err(Violation::new(
                    "replicas",
                    format!(
                        "node {id} (applied {their_applied:?}) holds another copy than node {first} (applied {applied:?})"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Stops every replica.
    pub(super) async fn stop(&mut self) {
        self.stand_down();
        for id in NODES {
            self.net.down(id);
            if let Some((raft, _)) = self.nodes.get_mut(&id).and_then(|n| n.up.take()) {
                let _ = raft.shutdown().await;
            }
        }
    }
}
