//! `/api/queues`: every queue the caller may see, those of one virtual host, or one, with
//! RabbitMQ's fields; the list paginated as RabbitMQ's (`page`, `page_size`, `name`,
//! `use_regex`, `sort`, `sort_reverse`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::Json;
use leasemq::QueueStats;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::auth::Caller;
use super::overview::{details, message_stats, Ages, Figure};
use super::rates::{Figures, PerSecond, Sample};
use super::reply::{Answer, ApiError};
use super::Management;
use crate::declared::Declared;
use crate::{dead_letter, names};

/// The most a page may hold, as RabbitMQ.
const MAX_PAGE_SIZE: usize = 500;

/// What a list's `name` filter lets through.
pub type NameFilter<'a> = Box<dyn Fn(&str) -> bool + 'a>;

/// RabbitMQ's pagination and filter parameters of a list.
#[derive(Debug, Default, Deserialize)]
pub struct Listing {
    /// The page wanted (from 1); without it, the whole list as an array.
    pub page: Option<usize>,
    /// Items a page (default 100).
    pub page_size: Option<usize>,
    /// Only the names that contain this (or match it, with `use_regex`).
    pub name: Option<String>,
    /// `name` is a regular expression.
    pub use_regex: Option<String>,
    /// The field to sort by (`name`, `messages`, `messages_ready`, …).
    pub sort: Option<String>,
    /// Descending.
    pub sort_reverse: Option<String>,
    /// Only these fields of each item, separated by commas (`message_stats.publish`
    /// reaches into an object).
    pub columns: Option<String>,
}

impl Listing {
    fn truthy(value: Option<&String>) -> bool {
        value.is_some_and(|v| v == "true")
    }

    /// What `name` (and `use_regex`) let through.
    pub fn filter(&self) -> Answer<NameFilter<'_>> {
        let Some(filter) = self.name.as_deref().filter(|f| !f.is_empty()) else {
            return Ok(Box::new(|_| true));
        };
        if Listing::truthy(self.use_regex.as_ref()) {
            let re = regex::Regex::new(filter)
                .map_err(|e| ApiError::bad_request(format!("name: {e}")))?;
            return Ok(Box::new(move |name| re.is_match(name)));
        }
        Ok(Box::new(move |name| name.contains(filter)))
    }

    /// The fields `columns` keeps, if it is given.
    pub fn columns(&self) -> Option<Vec<&str>> {
        let columns = self.columns.as_deref().filter(|c| !c.is_empty())?;
        Some(columns.split(',').map(str::trim).collect())
    }

    /// `items` with only the fields `columns` keeps.
    pub fn trim(&self, items: Vec<Value>) -> Vec<Value> {
        match self.columns() {
            None => items,
            Some(columns) => items.iter().map(|item| only(item, &columns)).collect(),
        }
    }

    /// The page asked for and its size, if one is.
    pub fn page(&self) -> Answer<Option<(usize, usize)>> {
        let Some(page) = self.page else {
            return Ok(None);
        };
        let size = self.page_size.unwrap_or(100);
        if page == 0 || size == 0 || size > MAX_PAGE_SIZE {
            return Err(ApiError::bad_request(format!(
                "page must be 1 or more and page_size 1 to {MAX_PAGE_SIZE}"
            )));
        }
        Ok(Some((page, size)))
    }

    /// RabbitMQ's page object: `chunk` is page `page` of `filtered` items.
    pub fn paged(chunk: Vec<Value>, page: usize, size: usize, filtered: usize) -> Value {
        serde_json::json!({
            "filtered_count": filtered,
            "item_count": chunk.len(),
            "items": chunk,
            "page": page,
            "page_count": filtered.div_ceil(size).max(1),
            "page_size": size,
            "total_count": filtered,
        })
    }

    /// `items` filtered, sorted and cut to the page asked for: a JSON array without
    /// `page`, else RabbitMQ's page object.
    pub fn answer(&self, mut items: Vec<Value>) -> Answer<Value> {
        let filter = self.filter()?;
        items.retain(|item| filter(item["name"].as_str().unwrap_or_default()));
        if let Some(key) = &self.sort {
            items.sort_by(|a, b| compare(&a[key.as_str()], &b[key.as_str()]));
        }
        if Listing::truthy(self.sort_reverse.as_ref()) {
            items.reverse();
        }
        let filtered = items.len();
        let Some((page, size)) = self.page()? else {
            return Ok(Value::Array(self.trim(items)));
        };
        let start = (page - 1).saturating_mul(size).min(filtered);
        let chunk: Vec<Value> = items.drain(start..(start + size).min(filtered)).collect();
        Ok(Listing::paged(self.trim(chunk), page, size, filtered))
    }
}

/// `item` with only the fields `columns` name (a dotted name reaches into an object).
pub fn only(item: &Value, columns: &[&str]) -> Value {
    let mut out = Value::Object(serde_json::Map::new());
    for column in columns {
        let path: Vec<&str> = column.split('.').collect();
        let Some(found) = (path.iter()).try_fold(item, |v, key| v.get(key)) else {
            continue;
        };
        let mut at = &mut out;
        for key in &path[..path.len() - 1] {
            at = &mut at[*key];
            if !at.is_object() {
                *at = Value::Object(serde_json::Map::new());
            }
        }
        at[path[path.len() - 1]] = found.clone();
    }
    out
}

/// Orders two JSON values of one field: numbers by value, others as text.
fn compare(a: &Value, b: &Value) -> std::cmp::Ordering {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x.total_cmp(&y),
        _ => a.to_string().cmp(&b.to_string()),
    }
}

/// `{"rate": r}`.
#[derive(Debug, Serialize)]
struct Rate {
    rate: f64,
}

/// A queue's `message_stats` in a list (no samples).
#[derive(Debug, Serialize)]
struct MessageStats {
    publish: u64,
    publish_details: Rate,
    deliver_get: u64,
    deliver_get_details: Rate,
    ack: u64,
    ack_details: Rate,
    redeliver: u64,
    redeliver_details: Rate,
}

impl MessageStats {
    fn of(f: &Figures, r: &PerSecond) -> MessageStats {
        MessageStats {
            publish: f.publish,
            publish_details: Rate { rate: r.publish },
            deliver_get: f.deliver_get,
            deliver_get_details: Rate {
                rate: r.deliver_get,
            },
            ack: f.ack,
            ack_details: Rate { rate: r.ack },
            redeliver: f.returned,
            redeliver_details: Rate { rate: r.returned },
        }
    }
}

/// A queue as `/api/queues` lists it.
#[derive(Debug, Serialize)]
struct QueueJson<'a> {
    name: &'a str,
    vhost: &'a str,
    durable: bool,
    auto_delete: bool,
    exclusive: bool,
    arguments: &'a serde_json::Map<String, Value>,
    node: &'a str,
    state: &'static str,
    #[serde(rename = "type")]
    kind: &'static str,
    messages: u64,
    messages_details: Rate,
    messages_ready: u64,
    messages_ready_details: Rate,
    messages_unacknowledged: u64,
    messages_unacknowledged_details: Rate,
    /// Ready messages waiting for a retry delay (leasemq's own; included in
    /// `messages_ready`).
    messages_delayed: u64,
    consumers: u64,
    policy: Option<()>,
    exclusive_consumer_tag: Option<()>,
    message_stats: MessageStats,
}

/// What a list shows of a queue beyond its stats: its declared flags and arguments.
#[derive(Debug, Clone)]
struct Shown {
    durable: bool,
    auto_delete: bool,
    exclusive: bool,
    quorum: bool,
    arguments: Arc<serde_json::Map<String, Value>>,
}

impl Shown {
    fn of(d: &Declared, exclusive: bool) -> Shown {
        Shown {
            durable: d.durable,
            auto_delete: d.auto_delete,
            exclusive,
            quorum: d.quorum,
            arguments: Arc::clone(&d.arguments),
        }
    }
}

/// What the virtual hosts know of each queue, by broker name.
struct Known {
    shown: HashMap<String, Shown>,
}

impl Known {
    fn of(state: &Management, vhost: Option<&str>) -> Known {
        let mut shown = HashMap::new();
        for host in &state.vhosts.all() {
            if vhost.is_some_and(|v| v != host.name) {
                continue;
            }
            let exclusive = host.exclusive.lock().expect("never poisoned");
            for (name, d) in host.declared.lock().expect("never poisoned").iter() {
                shown.insert(name.clone(), Shown::of(d, exclusive.contains_key(name)));
            }
        }
        Known { shown }
    }
}

/// One queue as a list shows it.
fn queue_row<'a>(
    state: &'a Management,
    names: (&'a str, &'a str),
    stats: &QueueStats,
    shown: Option<&'a Shown>,
    rates: &PerSecond,
    durable: impl FnOnce() -> bool,
) -> QueueJson<'a> {
    static EMPTY: std::sync::OnceLock<serde_json::Map<String, Value>> = std::sync::OnceLock::new();
    let f = Figures::of(stats);
    QueueJson {
        name: names.0,
        vhost: names.1,
        durable: shown.map_or_else(durable, |d| d.durable),
        auto_delete: shown.is_some_and(|d| d.auto_delete),
        exclusive: shown.is_some_and(|d| d.exclusive),
        arguments: shown.map_or_else(|| EMPTY.get_or_init(Default::default), |d| &*d.arguments),
        node: &state.node,
        state: "running",
        kind: if shown.is_some_and(|d| d.quorum) {
            "quorum"
        } else {
            "classic"
        },
        messages: f.messages,
        messages_details: Rate {
            rate: rates.messages,
        },
        messages_ready: f.ready,
        messages_ready_details: Rate { rate: rates.ready },
        messages_unacknowledged: f.unacked,
        messages_unacknowledged_details: Rate {
            rate: rates.unacked,
        },
        messages_delayed: stats.delayed as u64,
        consumers: stats.consumers as u64,
        policy: None,
        exclusive_consumer_tag: None,
        message_stats: MessageStats::of(&f, rates),
    }
}

/// One queue's JSON, with the samples of a chart if asked for.
fn queue_json(
    state: &Management,
    broker_name: &str,
    stats: &QueueStats,
    shown: Option<&Shown>,
    rates: &PerSecond,
    samples: Option<&[Sample]>,
) -> Value {
    let (vhost, name) = (names::vhost_of(broker_name), names::amqp(broker_name));
    let durable = || stats_durable(state, broker_name);
    let row = queue_row(state, (&name, &vhost), stats, shown, rates, durable);
    let mut value = serde_json::to_value(row).unwrap_or(Value::Null);
    if samples.is_some() {
        let lengths = |rate: f64, figure: Figure| details(rate, samples, figure);
        value["messages_details"] = lengths(rates.messages, |s| s.figures.messages);
        value["messages_ready_details"] = lengths(rates.ready, |s| s.figures.ready);
        value["messages_unacknowledged_details"] = lengths(rates.unacked, |s| s.figures.unacked);
        value["message_stats"] = message_stats(&Figures::of(stats), rates, samples);
    }
    value
}

/// Whether the broker keeps the queue on disk, for a queue the virtual host has no
/// declaration of (one made before the server kept them).
fn stats_durable(state: &Management, broker_name: &str) -> bool {
    state.settings.durable && (state.broker.queue(broker_name)).is_some_and(|q| q.is_durable())
}

/// A queue a list holds, before it is written.
struct Row {
    broker: String,
    vhost: String,
    name: String,
    stats: QueueStats,
    rates: PerSecond,
}

impl Row {
    /// What `sort` orders by: a number, or text.
    fn key(&self, field: &str) -> Result<f64, &str> {
        let f = Figures::of(&self.stats);
        Ok(match field {
            "messages" => f.messages as f64,
            "messages_ready" => f.ready as f64,
            "messages_unacknowledged" => f.unacked as f64,
            "consumers" => self.stats.consumers as f64,
            "message_stats.publish" => f.publish as f64,
            "message_stats.publish_details.rate" => self.rates.publish,
            "message_stats.deliver_get_details.rate" => self.rates.deliver_get,
            "message_stats.ack_details.rate" => self.rates.ack,
            "vhost" => return Err(&self.vhost),
            _ => return Err(&self.name),
        })
    }
}

/// Every queue (of `vhost`, if given) the caller may see, filtered, sorted and cut to the
/// page `listing` asks for, as the JSON the answer's body holds. Only the queues of the
/// page are written: a console that shows 50 of 10 000 queues costs the server the reads
/// of 10 000 stats and the writing of 50.
async fn list(
    state: Arc<Management>,
    caller: Caller,
    vhost: Option<String>,
    listing: Listing,
) -> Answer<Vec<u8>> {
    tokio::task::spawn_blocking(move || {
        let known = Known::of(&state, vhost.as_deref());
        let mut rows = rows(&state, &caller, vhost.as_deref(), &*listing.filter()?);
        if let Some(field) = listing.sort.as_deref() {
            rows.sort_by(|a, b| match (a.key(field), b.key(field)) {
                (Ok(x), Ok(y)) => x.total_cmp(&y),
                (x, y) => x.err().cmp(&y.err()),
            });
        }
        if Listing::truthy(listing.sort_reverse.as_ref()) {
            rows.reverse();
        }
        let write = |rows: &[Row]| -> Vec<Value> {
            let items = rows
                .iter()
                .map(|r| serde_json::to_value(row_json(&state, &known, r)).unwrap_or_default());
            listing.trim(items.collect())
        };
        let written = match listing.page()? {
            // The whole list, each queue written as it is made.
            None if listing.columns().is_none() => {
                let items: Vec<_> = rows.iter().map(|r| row_json(&state, &known, r)).collect();
                serde_json::to_vec(&items)
            }
            None => serde_json::to_vec(&write(&rows)),
            Some((page, size)) => {
                let filtered = rows.len();
                let start = (page - 1).saturating_mul(size).min(filtered);
                let chunk = write(&rows[start..(start + size).min(filtered)]);
                serde_json::to_vec(&Listing::paged(chunk, page, size, filtered))
            }
        };
        written.map_err(|e| ApiError::internal(e.to_string()))
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))?
}

/// A row as a list writes it.
fn row_json<'a>(state: &'a Management, known: &'a Known, r: &'a Row) -> QueueJson<'a> {
    let durable = || stats_durable(state, &r.broker);
    let shown = known.shown.get(&r.broker);
    queue_row(
        state,
        (&r.name, &r.vhost),
        &r.stats,
        shown,
        &r.rates,
        durable,
    )
}

/// The queues (of `vhost`, if given) the caller may see whose names `filter` lets
/// through, with their stats (one call per shard) and rates.
fn rows(
    state: &Management,
    caller: &Caller,
    vhost: Option<&str>,
    filter: &dyn Fn(&str) -> bool,
) -> Vec<Row> {
    let stats = state.broker.queue_stats();
    let mut seen_vhosts: HashMap<String, bool> = HashMap::new();
    let mut rows = Vec::with_capacity(stats.len());
    state.rates.with(|rate_of| {
        for (broker, s) in stats {
            if dead_letter::is_holding(&broker) {
                continue;
            }
            let queue_vhost = names::vhost_of(&broker).into_owned();
            if vhost.is_some_and(|v| v != queue_vhost) {
                continue;
            }
            let visible = *(seen_vhosts.entry(queue_vhost.clone()))
                .or_insert_with(|| caller.sees_vhost(&queue_vhost));
            let name = names::amqp(&broker).into_owned();
            if visible && filter(&name) {
                let rates = rate_of(&broker);
                rows.push(Row {
                    broker,
                    vhost: queue_vhost,
                    name,
                    stats: s,
                    rates,
                });
            }
        }
    });
    rows
}

/// A JSON body.
fn json_body(bytes: Vec<u8>) -> axum::response::Response {
    use axum::response::IntoResponse;
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        bytes,
    )
        .into_response()
}

/// `GET /api/queues`.
pub async fn all(
    State(state): State<Arc<Management>>,
    caller: Caller,
    Query(listing): Query<Listing>,
) -> Answer<axum::response::Response> {
    Ok(json_body(list(state, caller, None, listing).await?))
}

/// `GET /api/queues/{vhost}`.
pub async fn in_vhost(
    State(state): State<Arc<Management>>,
    caller: Caller,
    Path(vhost): Path<String>,
    Query(listing): Query<Listing>,
) -> Answer<axum::response::Response> {
    caller.vhost_access(&vhost)?;
    Ok(json_body(list(state, caller, Some(vhost), listing).await?))
}

/// The consumers of the queue `name` in `vhost`, as `/api/consumers` lists them.
async fn consumer_details(state: &Management, caller: &Caller, vhost: &str, name: &str) -> Value {
    let all = super::connections::consumers(state, caller, Some(vhost)).await;
    (all.into_iter())
        .filter(|c| c["queue"]["name"] == name)
        .collect()
}

/// `GET /api/queues/{vhost}/{name}`: with `lengths_age` or `msg_rates_age`, the samples of
/// that many seconds (and the queue's history is kept from then on).
pub async fn one(
    State(state): State<Arc<Management>>,
    caller: Caller,
    Path((vhost, name)): Path<(String, String)>,
    Query(ages): Query<Ages>,
) -> Answer<Json<Value>> {
    caller.vhost_access(&vhost)?;
    let host = state.vhosts.get(&vhost).ok_or_else(ApiError::not_found)?;
    let broker_name = host.broker_name(&name).into_owned();
    if dead_letter::is_holding(&broker_name) {
        return Err(ApiError::not_found());
    }
    let queue = {
        let broker = state.broker.clone();
        let name = broker_name.clone();
        tokio::task::spawn_blocking(move || broker.queue(&name).map(|q| q.stats()))
    };
    let stats = queue
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .ok_or_else(ApiError::not_found)?;
    let known = {
        let declared = host.declared.lock().expect("never poisoned");
        let exclusive = host.exclusive.lock().expect("never poisoned");
        (declared.get(&broker_name)).map(|d| Shown::of(d, exclusive.contains_key(&broker_name)))
    };
    let rates = state.rates.of(&broker_name);
    let samples =
        (ages.longest()).map(|age: Duration| state.rates.queue_history(&broker_name, age));
    let mut queue = queue_json(
        &state,
        &broker_name,
        &stats,
        known.as_ref(),
        &rates,
        samples.as_deref(),
    );
    queue["consumer_details"] = consumer_details(&state, &caller, &vhost, &name).await;
    if let Some(columns) = ages.columns.as_deref().filter(|c| !c.is_empty()) {
        let columns: Vec<&str> = columns.split(',').map(str::trim).collect();
        queue = only(&queue, &columns);
    }
    Ok(Json(queue))
}
