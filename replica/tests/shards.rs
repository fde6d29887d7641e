//! Three replicas of a shard: the leader's engine executes, each turn's logged changes
//! are one batch, and every replica restores the committed batches under the chain rule.
//! Their copies agree, and a copy promoted to lead serves what the leader held: leased
//! messages ready again with their attempts kept, acked ones gone.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::group::{Group, TestApplier};
use leasemq_engine::durable::{begin_batch, Change};
use leasemq_engine::{
    Command, ConsumerConfig, Delivered, Effects, Message, QueueConfig, QueueKey, Reply, Settle,
    Shard,
};
use leasemq_replica::{Applied, Batch, Replay, ReplayApplier};

const TICK: Duration = Duration::from_millis(1);

impl TestApplier for ReplayApplier {
    fn fresh() -> ReplayApplier {
        ReplayApplier::new(Replay::new(0, TICK))
    }

    fn state(&self) -> Vec<u8> {
        self.with(Replay::image)
    }
}

/// A leader's engine, and the batches its turns make.
struct Leader {
    engine: Shard,
    out: Effects,
    now: u64,
    inc: u32,
    p: u64,
}

impl Leader {
    fn new(engine: Shard, inc: u32) -> Leader {
        Leader {
            engine,
            out: Effects::new(),
            now: 0,
            inc,
            p: 0,
        }
    }

    /// Runs `cmd` on the engine: its reply, its deliveries, and the batch of what it
    /// logged.
    fn run(&mut self, cmd: Command) -> (Option<Reply>, Vec<Delivered>, Option<Batch>) {
        self.now += 1;
        self.engine.handle(self.now, cmd, &mut self.out);
        let reply = self.out.reply.take();
        let deliveries = self.out.deliveries.drain(..).map(|(_, d)| d).collect();
        if self.out.log.is_empty() {
            return (reply, deliveries, None);
        }
        let mut changes = Vec::new();
        begin_batch(&mut changes);
        let now = self.engine.log_time(self.now);
        Change::Clock { now }.encode(&mut changes);
        for change in self.out.log.drain(..) {
            change.encode(&mut changes);
        }
        self.p += 1;
        let (inc, p) = (self.inc, self.p);
        (reply, deliveries, Some(Batch { inc, p, changes }))
    }

    fn declare(&mut self, name: &str) -> (QueueKey, Batch) {
        let config = QueueConfig {
            durable: true,
            ..QueueConfig::default()
        };
        let cmd = Command::Declare {
            name: name.into(),
            config: Box::new(config),
        };
        match self.run(cmd) {
            (Some(Reply::Declared(Ok(key))), _, Some(batch)) => (key, batch),
            other => panic!("declare: {other:?}"),
        }
    }

    fn put(&mut self, queue: QueueKey, id: &str) -> Batch {
        let message = Message::new(id.as_bytes().to_vec()).with_id(id);
        let (_, _, batch) = self.run(Command::Put { queue, message });
        batch.expect("a durable put logs")
    }

    fn consume(&mut self, queue: QueueKey, prefetch: u32) -> (Vec<Delivered>, Option<Batch>) {
        let cmd = Command::Consume {
            queue,
            name: "worker".into(),
            config: ConsumerConfig { prefetch },
            priority: 0,
            ack_timeout: None,
        };
        match self.run(cmd) {
            (Some(Reply::Consumed(Ok(_))), deliveries, batch) => (deliveries, batch),
            other => panic!("consume: {other:?}"),
        }
    }
}

/// The messages a copy serves once promoted: (id, attempt) of every delivery a greedy
/// consumer gets.
fn served(applier: &ReplayApplier) -> Vec<(String, u32)> {
    let image = applier.state();
    let mut replay = Replay::new(0, TICK);
    replay.install(&image).unwrap();
    let mut out = Effects::new();
    let (engine, _) = replay.promote(1 << 40, &mut out);
    let mut leader = Leader::new(engine, 0);
    let queue = leader.engine.lookup("jobs").expect("the queue is there");
    let (deliveries, _) = leader.consume(queue, 1000);
    let mut served: Vec<(String, u32)> = deliveries
        .into_iter()
        .map(|d| (d.id.to_text(), d.attempt))
        .collect();
    served.sort();
    served
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_copy_holds_what_the_leader_logged_and_serves_it_once_promoted() {
    let group = Group::<ReplayApplier>::new().await;
    let node = group.leader(&[1, 2, 3]).await;
    let mut leader = Leader::new(Shard::new(0, TICK), 1);
    let (queue, batch) = leader.declare("jobs");
    let mut batches = vec![batch];
    let ids: Vec<String> = (0..60).map(|i| format!("m{i:02}")).collect();
    batches.extend(ids.iter().map(|id| leader.put(queue, id)));
    let (deliveries, batch) = leader.consume(queue, 20);
    assert_eq!(deliveries.len(), 20);
    batches.extend(batch);
    let mut leased: BTreeSet<String> = deliveries.iter().map(|d| d.id.to_text()).collect();
    let mut acked = BTreeSet::new();
    for d in deliveries.iter().step_by(2) {
        let cmd = Command::Settle {
            queue,
            tag: d.tag,
            op: Settle::Ack,
        };
        // Each ack frees the consumer's credit for one more delivery.
        let (reply, more, batch) = leader.run(cmd);
        assert!(matches!(reply, Some(Reply::Settled(true))));
        assert_eq!(more.len(), 1);
        batches.push(batch.expect("an ack of a durable queue logs"));
        acked.insert(d.id.to_text());
        leased.extend(more.iter().map(|d| d.id.to_text()));
    }
    leased.retain(|id| !acked.contains(id));
    group.write(node, batches).await;
    group.converged(node, &[1, 2, 3]).await;
    for id in 1..=3 {
        let served = served(&group.nodes[&id].applier);
        let expected: Vec<(String, u32)> = ids
            .iter()
            .filter(|id| !acked.contains(*id))
            .map(|id| (id.clone(), if leased.contains(id) { 2 } else { 1 }))
            .collect();
        assert_eq!(served, expected, "node {id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_after_a_hole_in_a_chain_are_skipped_by_every_copy_alike() {
    let group = Group::<ReplayApplier>::new().await;
    let node = group.leader(&[1, 2, 3]).await;
    let mut leader = Leader::new(Shard::new(0, TICK), 1);
    let (queue, declared) = leader.declare("jobs");
    let kept = leader.put(queue, "a");
    // Proposed, and refused: never committed.
    let _refused = leader.put(queue, "lost");
    let after_hole = vec![leader.put(queue, "x4"), leader.put(queue, "x5")];
    group.write(node, [declared.clone(), kept.clone()]).await;
    group.write(node, after_hole).await;
    // The leader, told its third proposal was refused, rebuilds from what was
    // committed and goes on as a new incarnation of its chain.
    let mut rebuilt = Replay::new(0, TICK);
    let log_id = leasemq_replica::log_id(1, 1, 1);
    for batch in [declared, kept] {
        let applied = Applied { log_id, batch };
        assert!(rebuilt.apply(&applied).unwrap());
    }
    let mut out = Effects::new();
    let (engine, chain) = rebuilt.promote(1 << 40, &mut out);
    let mut leader = Leader::new(engine, chain.inc + 1);
    let queue = leader.engine.lookup("jobs").unwrap();
    group.write(node, [leader.put(queue, "b")]).await;
    group.converged(node, &[1, 2, 3]).await;
    for id in 1..=3 {
        let served: Vec<String> = served(&group.nodes[&id].applier)
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        assert_eq!(served, ["a", "b"], "node {id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_behind_a_snapshot_installs_the_leader_s_image() {
    let group = Group::<ReplayApplier>::new().await;
    let node = group.leader(&[1, 2, 3]).await;
    let behind = (1..=3).find(|&id| id != node).unwrap();
    let mut leader = Leader::new(Shard::new(0, TICK), 1);
    let (queue, declared) = leader.declare("jobs");
    group.write(node, [declared]).await;
    group.converged(node, &[1, 2, 3]).await;
    let puts: Vec<Batch> = (0..150)
        .map(|i| leader.put(queue, &format!("m{i:03}")))
        .collect();
    group.snapshot_while_cut_off(node, behind, puts).await;
    group.converged(node, &[1, 2, 3]).await;
    let served = served(&group.nodes[&behind].applier);
    assert_eq!(served.len(), 150);
    assert!(served.iter().all(|(_, attempt)| *attempt == 1));
}
