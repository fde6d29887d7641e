//! How fast three replicas of one group commit, on this machine: three nodes in this
//! process, each with its log on the disk, joined by the node link on loopback, and a
//! leader proposing batches with a bounded number in flight. Prints committed batches
//! per second and the propose → commit latency.
//!
//! ```text
//! cargo run --release -p leasemq-replica --example commit_rate -- [batches] [bytes] [in flight]
//! ```
//!
//! Defaults: 20 000 batches of 1 024 bytes, 64 in flight. A batch stands for one turn of
//! a leader's changes; the applier only counts them, so this measures Raft, the link and
//! the logs' fsyncs, not the engine.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leasemq_replica::link::Link;
use leasemq_replica::{Applied, Applier, Batch, GroupDir, Identity, Outcome, Proposer, Raft};
use leasemq_wal::{DiskStorage, Options};
use openraft::async_runtime::WatchReceiver;
use openraft::BasicNode;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Counts what it applies; its image is the count.
#[derive(Clone, Default)]
struct Counter(Arc<AtomicU64>);

impl Applier for Counter {
    async fn apply(&self, batches: Vec<Applied>) -> std::io::Result<()> {
        self.0.fetch_add(batches.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    async fn image(&self) -> std::io::Result<Vec<u8>> {
        Ok(self.0.load(Ordering::Relaxed).to_le_bytes().to_vec())
    }

    async fn install(&self, image: Vec<u8>) -> std::io::Result<()> {
        let count = image
            .try_into()
            .map_err(|_| std::io::Error::other("not a count"))?;
        self.0.store(u64::from_le_bytes(count), Ordering::Relaxed);
        Ok(())
    }
}

fn arg(n: usize, default: u64) -> u64 {
    std::env::args()
        .nth(n)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

/// Three nodes over the link, their logs under `dir`; returns each node's replica.
async fn cluster(dir: &std::path::Path) -> BTreeMap<u64, Raft<Counter>> {
    let mut listeners = Vec::new();
    let mut peers = HashMap::new();
    for id in 1..=3u64 {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        peers.insert(id, listener.local_addr().expect("bound").to_string());
        listeners.push(listener);
    }
    let mut rafts = BTreeMap::new();
    for (id, listener) in (1..=3u64).zip(listeners) {
        let identity = Identity {
            tls: None,
            cluster: "bench".into(),
            node: id,
            shards: 1,
            secret: b"bench".to_vec(),
        };
        let link = Link::new(identity, peers.clone());
        let config = leasemq_replica::config("bench", Duration::from_secs(1)).expect("valid");
        let group = GroupDir::new(Arc::new(DiskStorage), dir.join(format!("node-{id}")));
        let raft = leasemq_replica::start(
            id,
            Arc::new(config),
            &group,
            Options::default(),
            Counter::default(),
            link.network(0),
        )
        .await
        .expect("a replica starts");
        link.serve_group(0, raft.clone());
        tokio::spawn(link.serve(listener));
        rafts.insert(id, raft);
    }
    let members: BTreeMap<u64, BasicNode> = peers
        .iter()
        .map(|(&id, addr)| (id, BasicNode::new(addr)))
        .collect();
    rafts[&1].initialize(members).await.expect("formed");
    rafts
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let (batches, bytes, in_flight) = (arg(1, 20_000), arg(2, 1024) as usize, arg(3, 64) as usize);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let rafts = cluster(dir.path()).await;
    let wait = rafts[&1].wait(Some(Duration::from_secs(30)));
    let metrics = wait
        .metrics(|m| m.current_leader.is_some(), "a leader")
        .await
        .expect("a leader");
    let leader = &rafts[&metrics.current_leader.expect("just waited")];
    let lease = leader.wait(Some(Duration::from_secs(30)));
    lease
        .leader_with_quorum_acked(None, "a lease")
        .await
        .expect("a lease");
    let vote = leader.metrics().borrow_watched().vote;
    let room = Arc::new(Semaphore::new(in_flight));
    let started: Arc<Mutex<HashMap<u64, Instant>>> = Arc::default();
    let mut latency =
        hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("bounds");
    let (tx, mut outcomes) = tokio::sync::mpsc::unbounded_channel();
    let report = {
        let (room, started) = (Arc::clone(&room), Arc::clone(&started));
        move |outcome: Outcome| {
            room.add_permits(1);
            let p = match outcome {
                Outcome::Committed { p, .. } | Outcome::Unknown { p } => p,
            };
            let at = started.lock().expect("not poisoned").remove(&p);
            let _ = tx.send((outcome, at.map(|at| at.elapsed())));
        }
    };
    let leader_id = (vote.leader_id.term, vote.leader_id.node_id);
    let proposer = Proposer::start(
        leader.clone(),
        leader_id,
        report,
        &tokio::runtime::Handle::current(),
    );
    let begin = Instant::now();
    let changes = vec![7u8; bytes];
    let feeding = tokio::spawn(async move {
        for p in 1..=batches {
            room.acquire().await.expect("open").forget();
            started
                .lock()
                .expect("not poisoned")
                .insert(p, Instant::now());
            proposer.propose(Batch {
                inc: 0,
                p,
                changes: changes.clone(),
            });
        }
        proposer
    });
    let mut committed = 0;
    for _ in 0..batches {
        let (outcome, took) = outcomes.recv().await.expect("every batch has an outcome");
        if matches!(outcome, Outcome::Committed { .. }) {
            committed += 1;
        }
        if let Some(took) = took {
            latency.saturating_record(took.as_micros() as u64);
        }
    }
    let elapsed = begin.elapsed();
    drop(feeding.await);
    println!(
        "{committed} of {batches} batches of {bytes} B committed on 3 replicas in {:.2} s: {:.0} batches/s, {in_flight} in flight",
        elapsed.as_secs_f64(),
        committed as f64 / elapsed.as_secs_f64()
    );
    println!(
        "propose -> commit: p50 {} us, p99 {} us, max {} us",
        latency.value_at_quantile(0.5),
        latency.value_at_quantile(0.99),
        latency.max()
    );
    for raft in rafts.values() {
        let _ = raft.shutdown().await;
    }
}
