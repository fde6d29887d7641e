//! Rates, as RabbitMQ's statistics database keeps them: every [`SAMPLE_EVERY`] each
//! queue's counters are read (one call per shard, `Broker::queue_stats`) and each figure's
//! rate is its change over the last interval, per second. The same counters feed
//! `/metrics`, so the API, the console and Prometheus agree.
//!
//! Kept: the last sample and rates of each live queue; the last [`HISTORY`] samples of
//! the server's totals (the overview's chart); and the same history of the queues a
//! client asked for samples of in the last [`WATCH_FOR`] (a queue's chart), so that a
//! server with many queues keeps history only for those someone looks at.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leasemq::{Broker, QueueStats};

use super::SAMPLE_EVERY;
use crate::dead_letter;

/// How many samples a history keeps (ten minutes at [`SAMPLE_EVERY`]).
pub const HISTORY: usize = 120;

/// How long a queue's history is kept after a client last asked for it.
pub const WATCH_FOR: Duration = Duration::from_secs(600);

/// The counters and gauges a rate or a chart is made of.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Figures {
    /// Messages taken in (`publish`).
    pub publish: u64,
    /// Deliveries made (`deliver_get`).
    pub deliver_get: u64,
    /// Messages acked (`ack`).
    pub ack: u64,
    /// Leases that ran out, nacks and releases: messages given back to be delivered again
    /// (leasemq's counterpart of `redeliver`, counted as they are given back).
    pub returned: u64,
    /// Messages in the queue, ready, delayed or unacked (`messages`).
    pub messages: u64,
    /// Ready and delayed (`messages_ready`).
    pub ready: u64,
    /// Unacked (`messages_unacknowledged`).
    pub unacked: u64,
}

impl Figures {
    /// A queue's figures from its stats.
    pub fn of(s: &QueueStats) -> Figures {
        Figures {
            publish: s.enqueued,
            deliver_get: s.delivered,
            ack: s.acked,
            returned: s.expired + s.nacked + s.released,
            messages: (s.ready + s.delayed + s.leased) as u64,
            ready: (s.ready + s.delayed) as u64,
            unacked: s.leased as u64,
        }
    }

    fn add(&mut self, other: &Figures) {
        self.publish += other.publish;
        self.deliver_get += other.deliver_get;
        self.ack += other.ack;
        self.returned += other.returned;
        self.messages += other.messages;
        self.ready += other.ready;
        self.unacked += other.unacked;
    }
}

/// Each figure's change per second over an interval (gauges may fall: signed).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PerSecond {
    /// As [`Figures`]' fields.
    pub publish: f64,
    /// As [`Figures`]' fields.
    pub deliver_get: f64,
    /// As [`Figures`]' fields.
    pub ack: f64,
    /// As [`Figures`]' fields.
    pub returned: f64,
    /// As [`Figures`]' fields.
    pub messages: f64,
    /// As [`Figures`]' fields.
    pub ready: f64,
    /// As [`Figures`]' fields.
    pub unacked: f64,
}

impl PerSecond {
    fn between(old: &Figures, new: &Figures, seconds: f64) -> PerSecond {
        let rate = |a: u64, b: u64| {
            // A counter that went back (a queue deleted and declared again) is a new start.
            let delta = b as f64 - a as f64;
            round(delta / seconds)
        };
        PerSecond {
            publish: rate(old.publish, new.publish).max(0.0),
            deliver_get: rate(old.deliver_get, new.deliver_get).max(0.0),
            ack: rate(old.ack, new.ack).max(0.0),
            returned: rate(old.returned, new.returned).max(0.0),
            messages: rate(old.messages, new.messages),
            ready: rate(old.ready, new.ready),
            unacked: rate(old.unacked, new.unacked),
        }
    }
}

/// Rates to one decimal, as RabbitMQ shows them.
fn round(rate: f64) -> f64 {
    (rate * 10.0).round() / 10.0
}

/// One sample of a history: when (ms since the epoch) and the figures then.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// Milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The figures.
    pub figures: Figures,
}

#[derive(Debug)]
struct QueueEntry {
    last: Figures,
    rates: PerSecond,
    history: Option<(Instant, VecDeque<Sample>)>,
}

#[derive(Debug, Default)]
struct State {
    queues: HashMap<String, QueueEntry>,
    totals: VecDeque<Sample>,
    total_rates: PerSecond,
    last_at: Option<Instant>,
}

/// The sampled rates; see the module docs.
#[derive(Debug, Default)]
pub struct Rates {
    state: Mutex<State>,
}

impl Rates {
    /// Samples `broker` every [`SAMPLE_EVERY`], stamped by `clock`, for as long as the
    /// future runs.
    pub async fn run(self: Arc<Self>, broker: Broker, clock: crate::clock::WallClock) {
        let mut every = tokio::time::interval(SAMPLE_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            let rates = Arc::clone(&self);
            let (broker, clock) = (broker.clone(), clock.clone());
            let sampled = tokio::task::spawn_blocking(move || {
                let stats = broker.queue_stats();
                rates.record(Instant::now(), clock.now_ms(), &stats);
            });
            if sampled.await.is_err() {
                return;
            }
        }
    }

    /// Takes in one sample of every queue's `stats`, made at `now` (`at_ms` on the wall
    /// clock).
    pub fn record(&self, now: Instant, at_ms: u64, stats: &[(String, QueueStats)]) {
        let mut state = self.state.lock().expect("never poisoned");
        let seconds = (state.last_at).map(|last| now.saturating_duration_since(last).as_secs_f64());
        let mut totals = Figures::default();
        let mut queues = HashMap::with_capacity(stats.len());
        for (name, s) in stats {
            if dead_letter::is_holding(name) {
                continue;
            }
            let figures = Figures::of(s);
            totals.add(&figures);
            let old = state.queues.remove(name);
            let rates = match (&old, seconds) {
                (Some(old), Some(secs)) if secs > 0.0 => {
                    PerSecond::between(&old.last, &figures, secs)
                }
                _ => PerSecond::default(),
            };
            let mut history = old.and_then(|o| o.history);
            if let Some((since, samples)) = &mut history {
                if now.saturating_duration_since(*since) > WATCH_FOR {
                    history = None;
                } else {
                    push(samples, Sample { at_ms, figures });
                }
            }
            let entry = QueueEntry {
                last: figures,
                rates,
                history,
            };
            queues.insert(name.clone(), entry);
        }
        let total_rates = match (state.totals.back(), seconds) {
            (Some(old), Some(secs)) if secs > 0.0 => {
                PerSecond::between(&old.figures, &totals, secs)
            }
            _ => PerSecond::default(),
        };
        push(
            &mut state.totals,
            Sample {
                at_ms,
                figures: totals,
            },
        );
        state.queues = queues;
        state.total_rates = total_rates;
        state.last_at = Some(now);
    }

    /// The rates of the queue the broker calls `name`, as of the last sample.
    pub fn of(&self, name: &str) -> PerSecond {
        let state = self.state.lock().expect("never poisoned");
        state.queues.get(name).map(|q| q.rates).unwrap_or_default()
    }

    /// Calls `with` with a lookup of each queue's rates by broker name, under one lock.
    pub fn with<R>(&self, with: impl FnOnce(&dyn Fn(&str) -> PerSecond) -> R) -> R {
        let state = self.state.lock().expect("never poisoned");
        let rate_of = |name: &str| state.queues.get(name).map(|q| q.rates).unwrap_or_default();
        with(&rate_of)
    }

    /// The server's totals: the last sample, and the rates over the last interval.
    pub fn totals(&self) -> (Figures, PerSecond) {
        let state = self.state.lock().expect("never poisoned");
        let last = state.totals.back().map(|s| s.figures).unwrap_or_default();
        (last, state.total_rates)
    }

    /// The totals' samples of the last `age`.
    pub fn totals_history(&self, age: Duration) -> Vec<Sample> {
        let state = self.state.lock().expect("never poisoned");
        within(&state.totals, age)
    }

    /// The samples of the last `age` of the queue the broker calls `name`; from now on
    /// (for [`WATCH_FOR`]) its history is kept.
    pub fn queue_history(&self, name: &str, age: Duration) -> Vec<Sample> {
        let mut state = self.state.lock().expect("never poisoned");
        // Watched from the last sample on, on the clock the samples are taken by.
        let now = state.last_at.unwrap_or_else(Instant::now);
        let Some(entry) = state.queues.get_mut(name) else {
            return Vec::new();
        };
        match &mut entry.history {
            Some((since, samples)) => {
                *since = now;
                within(samples, age)
            }
            None => {
                entry.history = Some((now, VecDeque::new()));
                Vec::new()
            }
        }
    }
}

fn push(samples: &mut VecDeque<Sample>, sample: Sample) {
    if samples.len() == HISTORY {
        samples.pop_front();
    }
    samples.push_back(sample);
}

fn within(samples: &VecDeque<Sample>, age: Duration) -> Vec<Sample> {
    let newest = samples.back().map_or(0, |s| s.at_ms);
    let oldest = newest.saturating_sub(age.as_millis() as u64);
    (samples.iter())
        .filter(|s| s.at_ms >= oldest)
        .copied()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(enqueued: u64, ready: usize) -> QueueStats {
        QueueStats {
            enqueued,
            ready,
            ..QueueStats::default()
        }
    }

    #[test]
    fn a_rate_is_the_change_over_the_interval_per_second() {
        let rates = Rates::default();
        let start = Instant::now();
        rates.record(start, 0, &[("jobs".into(), stats(100, 100))]);
        assert_eq!(
            rates.of("jobs"),
            PerSecond::default(),
            "one sample, no rate"
        );
        let later = start + Duration::from_secs(5);
        rates.record(later, 5000, &[("jobs".into(), stats(150, 80))]);
        let r = rates.of("jobs");
        assert_eq!(r.publish, 10.0);
        assert_eq!(r.ready, -4.0);
        let (totals, total_rates) = rates.totals();
        assert_eq!((totals.publish, totals.ready), (150, 80));
        assert_eq!(total_rates.publish, 10.0);
        assert_eq!(rates.totals_history(Duration::from_secs(60)).len(), 2);
    }

    #[test]
    fn a_queue_gone_drops_out_and_holding_queues_are_not_counted() {
        let rates = Rates::default();
        let now = Instant::now();
        let holding = dead_letter::holding_name("jobs");
        rates.record(
            now,
            0,
            &[("jobs".into(), stats(1, 1)), (holding, stats(5, 5))],
        );
        assert_eq!(rates.totals().0.messages, 1);
        rates.record(now + Duration::from_secs(5), 5000, &[]);
        assert_eq!(rates.with(|rate_of| rate_of("jobs")), PerSecond::default());
        assert_eq!(rates.state.lock().unwrap().queues.len(), 0);
    }

    #[test]
    fn a_queue_keeps_history_once_asked_and_never_more_than_the_bound() {
        let rates = Rates::default();
        let start = Instant::now();
        let at = |i: u64| (start + SAMPLE_EVERY * i as u32, i * 5000);
        let (now, ms) = at(0);
        rates.record(now, ms, &[("jobs".into(), stats(0, 0))]);
        assert!(rates.queue_history("jobs", WATCH_FOR).is_empty());
        for i in 1..=(HISTORY as u64 + 10) {
            let (now, ms) = at(i);
            rates.record(now, ms, &[("jobs".into(), stats(i, 0))]);
            // A console that shows the queue asks for its samples now and then.
            if i % 10 == 0 {
                rates.queue_history("jobs", SAMPLE_EVERY);
            }
        }
        let history = rates.queue_history("jobs", Duration::from_secs(3600));
        assert_eq!(history.len(), HISTORY);
        let recent = rates.queue_history("jobs", Duration::from_secs(10));
        assert_eq!(
            recent.len(),
            3,
            "the newest and the two 5 s and 10 s before"
        );
        assert_eq!(
            recent.last().map(|s| s.figures.publish),
            Some(HISTORY as u64 + 10)
        );
    }
}
