//! Three brokers in one process as a cluster (contract §9): answers wait for a majority's
//! commit (R1), a leader's death loses nothing answered (R2), leases end with their
//! leader and come back with attempt + 1 (R3), and tags stay fresh across leaders (R4).
//! The node link runs on loopback; each test takes its own ports and data dirs.

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::path::Path;
use std::time::{Duration, Instant};

use leasemq::{
    Broker, Cluster, ConsumerConfig, Error, Message, PutOutcome, QueueConfig, SyncPolicy,
};

const SHARDS: usize = 2;
const SECRET: &[u8] = b"a secret the three nodes share";

/// Free ports on loopback, one per node.
fn ports(n: usize) -> Vec<String> {
    let listeners: Vec<_> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind"))
        .collect();
    (listeners.iter())
        .map(|l| l.local_addr().expect("addr").to_string())
        .collect()
}

fn cluster(id: u64, addrs: &[String], call_timeout: Duration) -> Cluster {
    let mut cluster = Cluster::new("test", id)
        .listen(addrs[id as usize - 1].clone())
        .secret(SECRET)
        .election_timeout(Duration::from_millis(300))
        .call_timeout(call_timeout);
    for (i, addr) in addrs.iter().enumerate() {
        cluster = cluster.peer(i as u64 + 1, addr.clone());
    }
    cluster
}

fn node(dir: &Path, id: u64, addrs: &[String], call_timeout: Duration) -> Broker {
    Broker::builder()
        .shards(SHARDS)
        .data_dir(dir.join(format!("node-{id}")))
        .cluster(cluster(id, addrs, call_timeout))
        .build()
        .expect("node starts")
}

/// Three nodes of a new cluster, formed.
fn three(dir: &Path, call_timeout: Duration) -> (Vec<Option<Broker>>, Vec<String>) {
    let addrs = ports(3);
    let nodes: Vec<_> = (1..=3)
        .map(|id| Some(node(dir, id, &addrs, call_timeout)))
        .collect();
    let handle = nodes[0].as_ref().unwrap().cluster().expect("a node");
    handle.init().expect("init");
    handle
        .init()
        .expect("init on a formed cluster does nothing");
    (nodes, addrs)
}

/// The node that leads `shard`, once every live node agrees on one other than `not`.
fn leader(nodes: &[Option<Broker>], shard: usize, not: Option<u64>) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let seen: BTreeSet<Option<u64>> = (nodes.iter().flatten())
            .map(|b| b.cluster().unwrap().status().shards[shard].leader)
            .collect();
        if let [Some(leader)] = seen.iter().copied().collect::<Vec<_>>()[..] {
            if Some(leader) != not {
                return leader;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no leader for shard {shard}: {seen:?}"
        );
        // Elections take a few hundred milliseconds: look again shortly.
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn jobs_config() -> QueueConfig {
    QueueConfig {
        durable: true,
        ack_timeout: Duration::from_secs(60),
        ..QueueConfig::default()
    }
}

/// Three formed nodes in a new dir; the node that leads the shard of queue "jobs", and one
/// that does not.
fn formed() -> (tempfile::TempDir, Vec<Option<Broker>>, u64, u64) {
    let dir = tempfile::tempdir().unwrap();
    let (nodes, _) = three(dir.path(), Duration::from_secs(10));
    let first = leader(&nodes, leasemq::shard_for("jobs", SHARDS), None);
    let follower = (1..=3).find(|&id| id != first).unwrap();
    (dir, nodes, first, follower)
}

#[test]
fn what_a_leader_answered_survives_it_and_its_leases_come_back() {
    let (_dir, mut nodes, first, follower) = formed();
    let shard = leasemq::shard_for("jobs", SHARDS);
    let on = |nodes: &[Option<Broker>], id: u64| nodes[id as usize - 1].clone().unwrap();

    // Any node serves every queue: a node that does not lead the shard forwards (R6).
    let anywhere = on(&nodes, follower)
        .declare_queue("jobs", jobs_config())
        .unwrap();
    for i in 0..10 {
        let put = anywhere.put(Message::new(format!("job {i}")).with_id(format!("m{i}")));
        assert_eq!(put, Ok(PutOutcome::Enqueued));
    }
    let again = anywhere.put(Message::new("job 0").with_id("m0"));
    assert_eq!(again, Ok(PutOutcome::Duplicate));
    assert_eq!(anywhere.stats().ready, 10);
    let jobs = on(&nodes, first)
        .declare_queue("jobs", jobs_config())
        .unwrap();
    let worker = jobs.consume("w", ConsumerConfig { prefetch: 6 }).unwrap();
    let mut old_tags = Vec::new();
    let mut held = Vec::new();
    for i in 0..6 {
        let d = worker
            .recv_timeout(Duration::from_secs(10))
            .unwrap()
            .unwrap();
        assert_eq!(d.envelope().id, format!("m{i}"));
        old_tags.push(d.tag());
        if i < 3 {
            assert!(d.ack(), "ack answered once committed");
        } else {
            held.push(d);
        }
    }

    // The leader dies; a majority is left.
    on(&nodes, first).shutdown();
    nodes[first as usize - 1] = None;
    drop(held);
    let second = leader(&nodes, shard, Some(first));
    // The handle on the surviving node goes on, to the new leader wherever it is.
    let stats = anywhere.stats();
    assert_eq!((stats.ready, stats.leased), (7, 0), "{stats:?}");
    // A handle made through another node serves there once that node leads.
    let jobs = match second == follower {
        true => anywhere.clone(),
        false => on(&nodes, second)
            .declare_queue("jobs", jobs_config())
            .unwrap(),
    };

    let worker = jobs.consume("w", ConsumerConfig { prefetch: 100 }).unwrap();
    let mut ids = Vec::new();
    for _ in 0..7 {
        let d = worker
            .recv_timeout(Duration::from_secs(10))
            .unwrap()
            .unwrap();
        let id = d.envelope().id.to_string();
        let n: usize = id[1..].parse().unwrap();
        // Leased under the old leader (the three acks let m6 to m8 out to the
        // consumer): delivered again, its attempt spent (R3).
        let attempt = if n < 9 { 2 } else { 1 };
        assert_eq!(d.envelope().attempt, attempt, "{id}");
        assert!(old_tags.iter().all(|&t| d.tag() > t), "a fresh tag (R4)");
        ids.push(n);
        assert!(d.ack());
    }
    ids.sort_unstable();
    assert_eq!(
        ids,
        (3..10).collect::<Vec<_>>(),
        "acked ones never come back"
    );
    assert_eq!(
        worker
            .try_recv()
            .unwrap()
            .map(|d| d.envelope().id.to_string()),
        None
    );
    assert_eq!(jobs.stats().ready, 0);

    for node in nodes.into_iter().flatten() {
        node.shutdown();
    }
}

#[test]
fn a_leader_without_a_majority_answers_unavailable_and_ends_its_consumers() {
    let dir = tempfile::tempdir().unwrap();
    let (mut nodes, _) = three(dir.path(), Duration::from_secs(2));
    let shard = leasemq::shard_for("jobs", SHARDS);
    let first = leader(&nodes, shard, None);
    let broker = nodes[first as usize - 1].clone().unwrap();
    let jobs = broker.declare_queue("jobs", jobs_config()).unwrap();
    let worker = jobs.consume("w", ConsumerConfig::default()).unwrap();
    jobs.put(Message::new("before")).unwrap();
    let before = worker
        .recv_timeout(Duration::from_secs(10))
        .unwrap()
        .unwrap();
    assert_eq!(before.envelope().attempt, 1);

    for id in (1..=3).filter(|&id| id != first) {
        nodes[id as usize - 1].take().unwrap().shutdown();
    }
    // Nothing can commit: the put's outcome is unknown, and it says so.
    let put = jobs.put(Message::new("after").with_id("after"));
    assert!(matches!(put, Err(Error::Unavailable(_))), "{put:?}");
    // The lead ended with it, and the consumer and its lease with the lead.
    match worker.recv_timeout(Duration::from_secs(10)) {
        Err(Error::Unavailable(_)) => {}
        other => panic!("the consumer read {other:?}"),
    }
    assert!(!before.ack(), "a lease of a lead that ended is stale");
    broker.shutdown();
}

#[test]
fn calls_made_during_an_election_reach_the_leader_it_elects() {
    let dir = tempfile::tempdir().unwrap();
    let (mut nodes, _) = three(dir.path(), Duration::from_secs(10));
    let shard = leasemq::shard_for("jobs", SHARDS);
    let first = leader(&nodes, shard, None);
    let here = (1..=3).find(|&id| id != first).unwrap();
    let broker = nodes[here as usize - 1].clone().unwrap();
    let jobs = broker.declare_queue("jobs", jobs_config()).unwrap();

    // The leader dies. While the two left elect one of them, this node's shard thread
    // knows no leader for a moment, and the calls made then wait in it: those whose
    // callers do not make them again (pipelined, not waited for) must reach the leader
    // elected, wherever it is, or be answered `Unavailable`.
    nodes[first as usize - 1].take().unwrap().shutdown();
    let mut pipelined = Vec::new();
    let mut elected_at = None;
    for i in 0.. {
        let id = format!("m{i}");
        jobs.put_batch_nowait(vec![Message::new("not waited for").with_id(format!("n{i}"))]);
        pipelined.push((
            id.clone(),
            jobs.begin_put_batch(vec![Message::new("pipelined").with_id(id)]),
        ));
        let known = broker.cluster().unwrap().status().shards[shard].leader;
        if elected_at.is_none() && known.is_some_and(|l| l != first) {
            elected_at = Some(i);
        }
        if elected_at.is_some_and(|at| i > at + 200) {
            break;
        }
        assert!(i < 100_000, "no new leader");
        std::thread::sleep(Duration::from_micros(500));
    }
    let mut enqueued = 0;
    for (id, mut answer) in pipelined {
        let deadline = Instant::now() + Duration::from_secs(30);
        let answer = loop {
            if let Some(answer) = answer.try_answer() {
                break answer;
            }
            assert!(Instant::now() < deadline, "{id} was not answered");
            std::thread::sleep(Duration::from_millis(1));
        };
        match answer {
            Ok(outcomes) => {
                assert_eq!(outcomes, [PutOutcome::Enqueued], "{id}");
                enqueued += 1;
            }
            Err(Error::Unavailable(_)) => {}
            Err(e) => panic!("{id}: {e:?}"),
        }
    }
    // Every put answered `Enqueued` is there (with the nowait ones that made it).
    let stats = jobs.stats();
    assert!(stats.ready >= enqueued, "{} < {enqueued}", stats.ready);
    for node in nodes.into_iter().flatten() {
        node.shutdown();
    }
}

#[test]
fn a_cluster_s_settings_and_data_dir_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let addrs = ports(3);
    let build = |b: leasemq::BrokerBuilder| b.build().map(|b| b.shutdown());
    let c = || cluster(1, &addrs, Duration::from_secs(1));
    let needs = |r: Result<(), Error>, what: &str| match r {
        Err(Error::InvalidConfig(why)) => assert!(why.contains(what), "{why}"),
        other => panic!("built: {other:?}"),
    };
    needs(build(Broker::builder().cluster(c())), "data dir");
    let at = dir.path().join("n1");
    let with_dir = || Broker::builder().data_dir(&at).shards(SHARDS);
    needs(
        build(with_dir().cluster(c()).manual_clock()),
        "system clock",
    );
    let interval = SyncPolicy::Interval(Duration::from_millis(5));
    needs(
        build(with_dir().cluster(c()).sync(interval)),
        "SyncPolicy::Always",
    );
    needs(build(with_dir().cluster(c().secret(""))), "secret");
    needs(
        build(with_dir().cluster(Cluster::new("test", 4).listen(&addrs[0]))),
        "peers",
    );

    // The dir is a node's from its first start: no single broker opens it, nor another node.
    let node = with_dir().cluster(c()).build().unwrap();
    let volatile = node.declare_queue("v", QueueConfig::default());
    assert!(
        matches!(volatile, Err(Error::InvalidConfig(_))),
        "{volatile:?}"
    );
    node.shutdown();
    needs(build(with_dir()), "node 1 of cluster \"test\"");
    let two = cluster(2, &addrs, Duration::from_secs(1));
    needs(build(with_dir().cluster(two)), "this broker is node 2");
    let single = dir.path().join("single");
    build(Broker::builder().data_dir(&single)).unwrap();
    needs(
        build(Broker::builder().data_dir(&single).cluster(c())),
        "made for a single broker",
    );
}

#[test]
fn every_kind_of_call_reaches_the_leader_from_another_node() {
    let (_dir, nodes, first, follower) = formed();
    let on = |id: u64| nodes[id as usize - 1].clone().unwrap();
    let anywhere = on(follower).declare_queue("jobs", jobs_config()).unwrap();
    let here = on(first)
        .queue("jobs")
        .expect("declared through the follower");

    let batch = (0..4).map(|i| Message::new(format!("b{i}"))).collect();
    assert_eq!(anywhere.put_batch(batch).unwrap().len(), 4);
    anywhere.put_batch_nowait(vec![Message::new("n0"), Message::new("n1")]);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let put = runtime.block_on(anywhere.put_async(Message::new("a0")));
    assert_eq!(put, Ok(PutOutcome::Enqueued));
    // A nowait call forwarded to the leader may land after a later call: look until it has.
    let deadline = Instant::now() + Duration::from_secs(10);
    while anywhere.stats().ready < 7 {
        assert!(Instant::now() < deadline, "the nowait batch never landed");
        std::thread::sleep(Duration::from_millis(5));
    }

    let worker = here.consume("w", ConsumerConfig::default()).unwrap();
    let tags: Vec<_> = (0..7)
        .map(|_| {
            worker
                .recv_timeout(Duration::from_secs(10))
                .unwrap()
                .unwrap()
                .tag()
        })
        .collect();
    assert!(anywhere.ack(tags[0]));
    assert!(!anywhere.ack(tags[0]), "a second ack is stale");
    assert!(runtime.block_on(anywhere.ack_async(tags[1])));
    let settles = [
        (tags[2], leasemq::Settle::Ack),
        (tags[3], leasemq::Settle::Ack),
    ];
    assert_eq!(anywhere.settle_batch(&settles), vec![true, true]);
    anywhere.settle_batch_nowait(&[(tags[4], leasemq::Settle::Ack)]);
    while anywhere.stats().acked < 5 {
        assert!(Instant::now() < deadline, "the nowait settle never landed");
        std::thread::sleep(Duration::from_millis(5));
    }
    let stats = anywhere.stats();
    assert_eq!((stats.acked, stats.leased), (5, 2), "{stats:?}");
    assert_eq!(anywhere.purge(), Ok(0), "nothing ready");
    assert!(anywhere.close());
    assert!(on(first).queue("jobs").is_none());
    drop(runtime);
    for node in nodes.into_iter().flatten() {
        node.shutdown();
    }
}

#[test]
fn a_consumer_on_any_node_gets_its_deliveries_and_ends_with_the_lead() {
    let (_dir, mut nodes, first, follower) = formed();
    let shard = leasemq::shard_for("jobs", SHARDS);
    let on = |nodes: &[Option<Broker>], id: u64| nodes[id as usize - 1].clone().unwrap();
    let jobs = on(&nodes, follower)
        .declare_queue("jobs", jobs_config())
        .unwrap();
    let worker = jobs.consume("w", ConsumerConfig { prefetch: 4 }).unwrap();
    for i in 0..10 {
        jobs.put(Message::new(format!("job {i}")).with_id(format!("m{i}")))
            .unwrap();
    }
    let recv = |w: &leasemq::Consumer| w.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
    let got: Vec<_> = (0..4).map(|_| recv(&worker)).collect();
    let ids: Vec<_> = got.iter().map(|d| d.envelope().id.to_string()).collect();
    assert_eq!(
        ids,
        ["m0", "m1", "m2", "m3"],
        "in order, up to the prefetch"
    );
    assert!(got[0].ack(), "a settle goes to the leader");
    assert_eq!(
        worker.ack_up_to(got[2].tag()),
        2,
        "ack_up_to goes to the consumer's node"
    );
    let more = recv(&worker);
    assert_eq!(more.envelope().id, "m4", "credit came back");
    worker.stop();
    assert!(matches!(worker.try_recv(), Err(Error::Closed)));
    assert!(got[3].ack(), "a stopped consumer keeps its leases");
    worker.cancel();
    let stats = jobs.stats();
    assert_eq!(
        (stats.acked, stats.leased, stats.consumers),
        (4, 0, 0),
        "{stats:?}"
    );

    let worker = jobs.consume("w", ConsumerConfig::default()).unwrap();
    let held = recv(&worker);
    // The leader dies: the consumer's lead is over.
    on(&nodes, first).shutdown();
    nodes[first as usize - 1] = None;
    loop {
        match worker.recv_timeout(Duration::from_secs(10)) {
            Ok(Some(_)) => continue,
            Err(Error::Unavailable(_)) => break,
            other => panic!("the consumer read {other:?}"),
        }
    }
    assert!(!held.ack(), "its lease ended with the lead");
    let second = leader(&nodes, shard, Some(first));
    let jobs = on(&nodes, second).queue("jobs").unwrap();
    let worker = jobs.consume("w", ConsumerConfig::default()).unwrap();
    let rest: Vec<_> = (0..6).map(|_| recv(&worker)).collect();
    let again = rest.iter().find(|d| d.envelope().id == held.envelope().id);
    let again = again.expect("what was leased comes back");
    assert_eq!(again.envelope().attempt, held.envelope().attempt + 1);
    assert!(rest.iter().all(|d| d.ack()));
    assert_eq!(jobs.stats().ready, 0);
    for node in nodes.into_iter().flatten() {
        node.shutdown();
    }
}
