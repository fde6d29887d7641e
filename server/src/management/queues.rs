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

    /// `items` filtered, sorted and cut to the page asked for: a JSON array without
    /// `page`, else RabbitMQ's page object.
    pub fn answer(&self, mut items: Vec<Value>) -> Answer<Value> {
        if let Some(filter) = self.name.as_deref().filter(|f| !f.is_empty()) {
            let matches: Box<dyn Fn(&str) -> bool> = if Listing::truthy(self.use_regex.as_ref()) {
                let re = regex::Regex::new(filter)
                    .map_err(|e| ApiError::bad_request(format!("name: {e}")))?;
                Box::new(move |name| re.is_match(name))
            } else {
                Box::new(move |name| name.contains(filter))
            };
            items.retain(|item| matches(item["name"].as_str().unwrap_or_default()));
        }
        let filtered = items.len();
        if let Some(key) = &self.sort {
            items.sort_by(|a, b| compare(&a[key.as_str()], &b[key.as_str()]));
        }
        if Listing::truthy(self.sort_reverse.as_ref()) {
            items.reverse();
        }
        if let Some(columns) = self.columns.as_deref().filter(|c| !c.is_empty()) {
            let columns: Vec<&str> = columns.split(',').map(str::trim).collect();
            for item in &mut items {
                *item = only(item, &columns);
            }
        }
        let Some(page) = self.page else {
            return Ok(Value::Array(items));
        };
        let size = self.page_size.unwrap_or(100);
        if page == 0 || size == 0 || size > MAX_PAGE_SIZE {
            return Err(ApiError::bad_request(format!(
                "page must be 1 or more and page_size 1 to {MAX_PAGE_SIZE}"
            )));
        }
        let pages = filtered.div_ceil(size).max(1);
        let start = (page - 1).saturating_mul(size).min(filtered);
        let chunk: Vec<Value> = items.drain(start..(start + size).min(filtered)).collect();
        Ok(serde_json::json!({
            "filtered_count": filtered,
            "item_count": chunk.len(),
            "items": chunk,
            "page": page,
            "page_count": pages,
            "page_size": size,
            "total_count": filtered,
        }))
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
    message_stats: Value,
}

/// What the virtual hosts know of each queue, by broker name: its declared flags, and
/// whether it is exclusive.
struct Known {
    declared: HashMap<String, (Declared, bool)>,
}

impl Known {
    fn of(state: &Management, vhost: Option<&str>) -> Known {
        let mut declared = HashMap::new();
        for host in &state.vhosts.all() {
            if vhost.is_some_and(|v| v != host.name) {
                continue;
            }
            let exclusive = host.exclusive.lock().expect("never poisoned");
            for (name, d) in host.declared.lock().expect("never poisoned").iter() {
                declared.insert(name.clone(), (d.clone(), exclusive.contains_key(name)));
            }
        }
        Known { declared }
    }
}

/// One queue's JSON.
fn queue_json(
    state: &Management,
    broker_name: &str,
    stats: &QueueStats,
    known: Option<&(Declared, bool)>,
    rates: &PerSecond,
    samples: Option<&[Sample]>,
) -> Value {
    let vhost = names::vhost_of(broker_name);
    let name = names::amqp(broker_name);
    let f = Figures::of(stats);
    let empty = serde_json::Map::new();
    let (declared, exclusive) = match known {
        Some((d, exclusive)) => (Some(d), *exclusive),
        None => (None, false),
    };
    let lengths = |rate: f64, figure: Figure| details(rate, samples, figure);
    let json = QueueJson {
        name: &name,
        vhost: &vhost,
        durable: declared.map_or(stats_durable(state, broker_name), |d| d.durable),
        auto_delete: declared.is_some_and(|d| d.auto_delete),
        exclusive,
        arguments: declared.map_or(&empty, |d| &d.arguments),
        node: &state.node,
        state: "running",
        kind: if declared.is_some_and(|d| d.quorum) {
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
        message_stats: message_stats(&f, rates, samples),
    };
    let mut value = serde_json::to_value(json).unwrap_or(Value::Null);
    if samples.is_some() {
        value["messages_details"] = lengths(rates.messages, |s| s.figures.messages);
        value["messages_ready_details"] = lengths(rates.ready, |s| s.figures.ready);
        value["messages_unacknowledged_details"] = lengths(rates.unacked, |s| s.figures.unacked);
    }
    value
}

/// Whether the broker keeps the queue on disk, for a queue the virtual host has no
/// declaration of (one made before the server kept them).
fn stats_durable(state: &Management, broker_name: &str) -> bool {
    state.settings.durable && (state.broker.queue(broker_name)).is_some_and(|q| q.is_durable())
}

/// Every queue (of `vhost`, if given) the caller may see, as JSON.
async fn list(state: Arc<Management>, caller: Caller, vhost: Option<String>) -> Answer<Vec<Value>> {
    tokio::task::spawn_blocking(move || {
        let stats = state.broker.queue_stats();
        let known = Known::of(&state, vhost.as_deref());
        let mut rates = HashMap::new();
        state.rates.each(|name, r| {
            rates.insert(name.to_string(), *r);
        });
        let mut seen_vhosts: HashMap<String, bool> = HashMap::new();
        let mut items = Vec::with_capacity(stats.len());
        for (name, s) in &stats {
            if dead_letter::is_holding(name) {
                continue;
            }
            let queue_vhost = names::vhost_of(name);
            if vhost.as_deref().is_some_and(|v| v != queue_vhost) {
                continue;
            }
            let visible = *(seen_vhosts.entry(queue_vhost.to_string()))
                .or_insert_with(|| caller.sees_vhost(&queue_vhost));
            if !visible {
                continue;
            }
            let r = rates.get(name.as_str()).copied().unwrap_or_default();
            items.push(queue_json(
                &state,
                name,
                s,
                known.declared.get(name),
                &r,
                None,
            ));
        }
        items
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))
}

/// `GET /api/queues`.
pub async fn all(
    State(state): State<Arc<Management>>,
    caller: Caller,
    Query(listing): Query<Listing>,
) -> Answer<Json<Value>> {
    let items = list(state, caller, None).await?;
    Ok(Json(listing.answer(items)?))
}

/// `GET /api/queues/{vhost}`.
pub async fn in_vhost(
    State(state): State<Arc<Management>>,
    caller: Caller,
    Path(vhost): Path<String>,
    Query(listing): Query<Listing>,
) -> Answer<Json<Value>> {
    caller.vhost_access(&vhost)?;
    let items = list(state, caller, Some(vhost)).await?;
    Ok(Json(listing.answer(items)?))
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
        (declared.get(&broker_name)).map(|d| (d.clone(), exclusive.contains_key(&broker_name)))
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
