//! What a seed fixes before the first step: the shard count, the tick, the queue names and
//! the configs each name may be declared with.
//!
//! A replayed (or shrunk) trace runs under the same setup, so everything an [`Op`]
//! refers to by index lives here.
//!
//! [`Op`]: crate::Op

use std::fmt;
use std::time::Duration;

use leasemq_engine::{Overflow, QueueConfig, RetryPolicy};

use crate::rng::Rng;

/// How many queue names a seed uses.
pub const NAMES: usize = 5;
/// Configs per name: the first ones valid, the last one deliberately invalid.
pub const CONFIGS: usize = 3;
/// Consumer names per queue; index [`CONSUMER_NAMES`]`.len()` stands for the invalid
/// empty name.
pub const CONSUMER_NAMES: [&str; 4] = ["ann", "bob", "cy", "dee"];
/// The name index that stands for an invalid queue name.
pub const BAD_NAME: u8 = NAMES as u8;
const BAD_NAME_TEXT: &str = "no spaces allowed";

/// Everything a trace needs besides its ops.
#[derive(Clone, Debug)]
pub struct Setup {
    pub seed: u64,
    pub shards: usize,
    pub tick: Duration,
    /// Queue names, placed on shards by `leasemq_shard::shard_for`.
    pub names: Vec<String>,
    /// `configs[name][i]`; index `CONFIGS - 1` is invalid.
    pub configs: Vec<Vec<QueueConfig>>,
    /// Whether the run has a data dir: some names are durable queues, each shard keeps a
    /// log on a simulated disk, and the broker crashes now and then (see `crate::storage`).
    pub durable: bool,
}

impl Setup {
    pub fn from_seed(seed: u64) -> Setup {
        let mut rng = Rng::new(seed ^ 0x5e70_0000_0000_0001);
        let shards = rng.range(2, 4) as usize;
        let tick = match rng.below(10) {
            0 => Duration::from_millis(2),
            1 => Duration::from_millis(5),
            _ => Duration::from_millis(1),
        };
        let salt = seed % 1000;
        let names: Vec<String> = (0..NAMES).map(|i| format!("q{i}.{salt}")).collect();
        let configs = (0..NAMES)
            .map(|i| {
                let mut palette: Vec<QueueConfig> = (0..CONFIGS - 1)
                    .map(|_| valid_config(&mut rng, &names, i))
                    .collect();
                palette.push(invalid_config(&mut rng, &names[i], &palette[0]));
                palette
            })
            .collect();
        Setup {
            seed,
            shards,
            tick,
            names,
            configs,
            durable: false,
        }
    }

    /// The setup of [`Setup::from_seed`] with a data dir: a seeded choice of names become
    /// durable queues (every config of a name alike). A durable queue's dead-letter queue
    /// must be durable too (contract §7), so a durable name's config that points at a
    /// name in memory points at a durable one instead, or at none.
    pub fn durable_from_seed(seed: u64) -> Setup {
        let mut setup = Setup::from_seed(seed);
        setup.durable = true;
        let mut rng = Rng::new(seed ^ 0xd0_0000_0000_0003);
        // At least one durable name, and now and then every name.
        let all = rng.one_in(5);
        let mut durable: Vec<bool> = (0..NAMES).map(|_| all || rng.percent(60)).collect();
        durable[rng.index(NAMES)] = true;
        let durable_names: Vec<String> = (0..NAMES)
            .filter(|&i| durable[i])
            .map(|i| setup.names[i].clone())
            .collect();
        for (i, row) in setup.configs.iter_mut().enumerate() {
            let others: Vec<&String> = durable_names
                .iter()
                .filter(|n| **n != setup.names[i])
                .collect();
            for config in row.iter_mut() {
                config.durable = durable[i];
                let in_memory = config
                    .dead_letter
                    .as_ref()
                    .is_some_and(|d| !durable_names.contains(d));
                // The invalid config that names itself as its dead-letter queue stays so.
                let itself = config.dead_letter.as_deref() == Some(setup.names[i].as_str());
                if durable[i] && in_memory && !itself {
                    config.dead_letter = if others.is_empty() {
                        None
                    } else {
                        Some(others[rng.index(others.len())].clone())
                    };
                }
            }
        }
        setup
    }

    /// Whether queue name `name` is declared durable.
    pub fn is_durable(&self, name: u8) -> bool {
        self.configs
            .get(usize::from(name))
            .is_some_and(|row| row[0].durable)
    }

    /// The text of name index `name` (`BAD_NAME` is an invalid name).
    pub fn name(&self, name: u8) -> &str {
        self.names
            .get(usize::from(name))
            .map_or(BAD_NAME_TEXT, String::as_str)
    }

    /// The name index of a queue name, if it is one of ours.
    pub fn name_index(&self, name: &str) -> Option<u8> {
        self.names.iter().position(|n| n == name).map(|i| i as u8)
    }

    pub fn config(&self, name: u8, config: u8) -> &QueueConfig {
        let row = self
            .configs
            .get(usize::from(name))
            .unwrap_or(&self.configs[0]);
        &row[usize::from(config) % CONFIGS]
    }

    /// Whether `config` passes validation: every palette entry but the last of each row.
    pub fn is_valid(&self, config: &QueueConfig) -> bool {
        self.configs
            .iter()
            .any(|row| row[..CONFIGS - 1].iter().any(|c| c == config))
    }

    /// The shard that owns queue name `name`.
    pub fn shard_of(&self, name: u8) -> usize {
        leasemq_shard::shard_for(self.name(name), self.shards)
    }

    pub fn tick_nanos(&self) -> u64 {
        u64::try_from(self.tick.as_nanos()).expect("a tick of a few ms")
    }

    /// `d` in whole ticks, rounded up (contract §4 Ticks: nothing fires early).
    pub fn ticks(&self, d: Duration) -> u64 {
        let nanos = d.as_nanos();
        let ticks = nanos.div_ceil(u128::from(self.tick_nanos()));
        u64::try_from(ticks).unwrap_or(u64::MAX)
    }
}

impl fmt::Display for Setup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "seed {} | {} shards | tick {:?}{}",
            self.seed,
            self.shards,
            self.tick,
            if self.durable { " | durable" } else { "" }
        )?;
        for (i, name) in self.names.iter().enumerate() {
            writeln!(
                f,
                "  queue {i} = {name:?} on shard {}",
                self.shard_of(i as u8)
            )?;
            for (j, c) in self.configs[i].iter().enumerate() {
                writeln!(f, "    config {j}: {}", describe(c))?;
            }
        }
        Ok(())
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn valid_config(rng: &mut Rng, names: &[String], me: usize) -> QueueConfig {
    let ack = if rng.percent(60) {
        rng.pick(&[2, 10, 30, 100, 250])
    } else {
        rng.range(1, 500)
    };
    let retry = RetryPolicy {
        initial: ms(rng.pick(&[0, 1, 5, 20, 100])),
        multiplier: rng.pick(&[1.0, 2.0]),
        max: ms(rng.pick(&[0, 10, 100, 1000])),
        jitter: 0.0,
    };
    let dead_letter = rng.percent(55).then(|| {
        let other = (me + 1 + rng.index(names.len() - 1)) % names.len();
        names[other].clone()
    });
    QueueConfig {
        ack_timeout: ms(ack),
        max_lease: rng
            .percent(30)
            .then(|| ms(ack * rng.range(1, 4) + rng.below(ack))),
        retry,
        max_deliveries: rng.percent(45).then(|| rng.range(1, 5) as u32),
        dead_letter,
        dedup_window: if rng.percent(50) {
            Duration::ZERO
        } else {
            ms(rng.range(1, 300))
        },
        max_length: rng.percent(25).then(|| rng.range(2, 20) as usize),
        // The ledger knows a ready message's class (returned or fresh), not its place in
        // line, so it cannot tell which message a `DropHead` put drops; the engine's model
        // test, which keeps the exact order, covers that overflow.
        overflow: Overflow::RejectPublish,
        max_body_bytes: if rng.percent(15) {
            rng.range(8, 64) as usize
        } else {
            1024 * 1024
        },
        // Set by `Setup::durable_from_seed` for the names that are durable.
        durable: false,
        // The ledger checks which class of ready message (returned or fresh) a delivery
        // comes from, which priorities reorder; the engine's model test covers them.
        max_priority: None,
    }
}

/// A config that breaks one limit of contract §3 Limits, so `declare` answers `InvalidConfig`.
fn invalid_config(rng: &mut Rng, name: &str, base: &QueueConfig) -> QueueConfig {
    let mut c = base.clone();
    match rng.below(5) {
        0 => c.ack_timeout = Duration::ZERO,
        1 => c.max_deliveries = Some(0),
        2 => c.dead_letter = Some(name.to_string()),
        3 => c.max_lease = Some(c.ack_timeout / 2),
        _ => c.max_length = Some(0),
    }
    c
}

/// A one-line summary of a config.
pub fn describe(c: &QueueConfig) -> String {
    let mut s = format!("ack {:?}", c.ack_timeout);
    if let Some(l) = c.max_lease {
        s += &format!(", max_lease {l:?}");
    }
    s += &format!(
        ", retry {:?}×{}≤{:?}",
        c.retry.initial, c.retry.multiplier, c.retry.max
    );
    if let Some(m) = c.max_deliveries {
        s += &format!(", max_deliveries {m}");
    }
    if let Some(d) = &c.dead_letter {
        s += &format!(", dead_letter {d:?}");
    }
    if !c.dedup_window.is_zero() {
        s += &format!(", dedup {:?}", c.dedup_window);
    }
    if let Some(m) = c.max_length {
        s += &format!(", max_length {m}");
    }
    if c.max_body_bytes != 1024 * 1024 {
        s += &format!(", max_body {}", c.max_body_bytes);
    }
    if c.durable {
        s += ", durable";
    }
    s
}
