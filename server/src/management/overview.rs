//! The node as a whole: `/api/overview`, `/api/whoami`, `/api/vhosts`, the health
//! checks, and `/metrics`.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::header;
use axum::response::IntoResponse;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::auth::Caller;
use super::rates::{Figures, PerSecond, Sample};
use super::reply::{Answer, ApiError};
use super::{Management, RABBITMQ_VERSION};
use crate::dead_letter;

/// The `lengths_age` and `msg_rates_age` of a request (seconds of samples wanted), as
/// RabbitMQ's console asks for a chart.
#[derive(Debug, Default, Deserialize)]
pub struct Ages {
    /// Seconds of queue-length samples.
    pub lengths_age: Option<u64>,
    /// Seconds of message-rate samples.
    pub msg_rates_age: Option<u64>,
    /// Only these fields, separated by commas (as a list's `columns`).
    pub columns: Option<String>,
}

impl Ages {
    /// The longer age asked for, if any.
    pub fn longest(&self) -> Option<Duration> {
        (self.lengths_age.max(self.msg_rates_age)).map(Duration::from_secs)
    }
}

/// One figure of a sample, as a chart plots it.
pub type Figure = fn(&Sample) -> u64;

/// `{"rate": r}`, and with `samples` the samples of `figure` for a chart (newest first,
/// as RabbitMQ).
pub fn details(rate: f64, samples: Option<&[Sample]>, figure: Figure) -> Value {
    match samples {
        None => json!({ "rate": rate }),
        Some(samples) => {
            let samples: Vec<Value> = (samples.iter().rev())
                .map(|s| json!({"sample": figure(s), "timestamp": s.at_ms}))
                .collect();
            json!({ "rate": rate, "samples": samples })
        }
    }
}

/// RabbitMQ's `message_stats` of a queue or the node: counters and their rates.
pub fn message_stats(counted: &Figures, rates: &PerSecond, samples: Option<&[Sample]>) -> Value {
    json!({
        "publish": counted.publish,
        "publish_details": details(rates.publish, samples, |s| s.figures.publish),
        "deliver_get": counted.deliver_get,
        "deliver_get_details": details(rates.deliver_get, samples, |s| s.figures.deliver_get),
        "ack": counted.ack,
        "ack_details": details(rates.ack, samples, |s| s.figures.ack),
        "redeliver": counted.returned,
        "redeliver_details": details(rates.returned, samples, |s| s.figures.returned),
    })
}

/// `GET /api/overview`.
pub async fn overview(
    State(state): State<Arc<Management>>,
    caller: Caller,
    Query(ages): Query<Ages>,
) -> Answer<Json<Value>> {
    let broker = state.broker.clone();
    let stats = tokio::task::spawn_blocking(move || broker.queue_stats())
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let mut totals = super::rates::Figures::default();
    let (mut queues, mut consumers) = (0u64, 0u64);
    for (name, s) in stats.iter().filter(|(n, _)| !dead_letter::is_holding(n)) {
        if caller.level < super::auth::Level::Monitoring
            && !caller.sees_vhost(&crate::names::vhost_of(name))
        {
            continue;
        }
        let f = super::rates::Figures::of(s);
        totals.messages += f.messages;
        totals.ready += f.ready;
        totals.unacked += f.unacked;
        queues += 1;
        consumers += s.consumers as u64;
    }
    let (counted, rates) = state.rates.totals();
    let history = ages.longest().map(|age| state.rates.totals_history(age));
    let samples = history.as_deref();
    let lengths = |figure: Figure, rate: f64| details(rate, samples, figure);
    let metrics = &state.settings.metrics;
    let exchanges: usize = (state.vhosts.all().iter())
        .filter(|v| caller.level >= super::auth::Level::Monitoring || caller.sees_vhost(&v.name))
        .map(|v| v.exchanges.lock().expect("never poisoned").len())
        .sum();
    let listeners: Vec<Value> = (state.listeners.iter())
        .map(|(protocol, port)| {
            json!({"node": state.node, "protocol": protocol, "ip_address": "::", "port": port})
        })
        .collect();
    Ok(Json(json!({
        "management_version": RABBITMQ_VERSION,
        "rabbitmq_version": RABBITMQ_VERSION,
        "product_name": "leasemqd",
        "product_version": env!("CARGO_PKG_VERSION"),
        "cluster_name": state.node,
        "node": state.node,
        "rates_mode": "basic",
        "disable_stats": false,
        "exchange_types": exchange_types(),
        "message_stats": message_stats(&counted, &rates, samples),
        "queue_totals": {
            "messages": totals.messages,
            "messages_details": lengths(|s| s.figures.messages, rates.messages),
            "messages_ready": totals.ready,
            "messages_ready_details": lengths(|s| s.figures.ready, rates.ready),
            "messages_unacknowledged": totals.unacked,
            "messages_unacknowledged_details": lengths(|s| s.figures.unacked, rates.unacked),
        },
        "object_totals": {
            "connections": metrics.connections.get().max(0),
            "channels": metrics.channels.get().max(0),
            "queues": queues,
            "consumers": consumers,
            "exchanges": exchanges,
        },
        "listeners": listeners,
        "alarms": alarms_raised(&state),
    })))
}

/// The exchange types, as the overview lists them.
fn exchange_types() -> Value {
    let kind = |name: &str, description: &str| json!({"name": name, "description": description, "enabled": true});
    json!([
        kind(
            "direct",
            "AMQP direct exchange, as per the AMQP specification"
        ),
        kind(
            "fanout",
            "AMQP fanout exchange, as per the AMQP specification"
        ),
        kind(
            "headers",
            "AMQP headers exchange, as per the AMQP specification"
        ),
        kind(
            "topic",
            "AMQP topic exchange, as per the AMQP specification"
        ),
    ])
}

/// The alarms in effect, as RabbitMQ names their resources.
fn alarms_raised(state: &Management) -> Vec<Value> {
    (state.settings.alarms.raised_resources().into_iter())
        .map(|r| json!({"node": state.node, "resource": r.name()}))
        .collect()
}

/// `GET /api/whoami`.
pub async fn whoami(caller: Caller) -> Json<Value> {
    Json(json!({
        "name": caller.user.name,
        "tags": caller.user.tags,
    }))
}

/// `GET /api/vhosts`: those the caller may list.
pub async fn vhosts(State(state): State<Arc<Management>>, caller: Caller) -> Json<Value> {
    let listed: Vec<Value> = (state.settings.access.vhosts().iter())
        .filter(|name| caller.lists_vhost(name))
        .map(|name| vhost_json(&state, name))
        .collect();
    Json(Value::Array(listed))
}

/// `GET /api/vhosts/{name}` (administrators, as RabbitMQ).
pub async fn vhost(
    State(state): State<Arc<Management>>,
    caller: Caller,
    Path(name): Path<String>,
) -> Answer<Json<Value>> {
    caller.require_administrator()?;
    match state.settings.access.has_vhost(&name) {
        true => Ok(Json(vhost_json(&state, &name))),
        false => Err(ApiError::not_found()),
    }
}

/// One virtual host as `/api/vhosts` lists it.
fn vhost_json(state: &Management, name: &str) -> Value {
    json!({
        "name": name,
        "description": "",
        "tags": [],
        "tracing": false,
        "cluster_state": { state.node.clone(): "running" },
    })
}

/// `GET /api/health/checks/alarms`: 200 with none in effect, else 503 naming them.
pub async fn alarms(State(state): State<Arc<Management>>, _caller: Caller) -> impl IntoResponse {
    let raised = alarms_raised(&state);
    if raised.is_empty() {
        (axum::http::StatusCode::OK, Json(json!({"status": "ok"})))
    } else {
        let body = json!({"status": "failed", "reason": "resource alarm(s) in effect in the cluster", "alarms": raised});
        (axum::http::StatusCode::SERVICE_UNAVAILABLE, Json(body))
    }
}

/// `GET /api/aliveness-test/{vhost}`: as the caller, declares a queue `aliveness-test`
/// there, publishes a message to it and takes it back, as RabbitMQ does.
pub async fn aliveness(
    State(state): State<Arc<Management>>,
    caller: Caller,
    Path(vhost): Path<String>,
) -> Answer<Json<Value>> {
    use amq_protocol::protocol::{queue, AMQPClass};
    let test = |conn: &mut crate::internal::Internal| {
        let declare = queue::Declare {
            queue: "aliveness-test".into(),
            ..queue::Declare::default()
        };
        conn.method(AMQPClass::Queue(queue::AMQPMethod::Declare(declare)))?;
        let message = super::messages::Publish {
            routing_key: "aliveness-test".into(),
            payload: b"test_message".to_vec(),
            properties: Default::default(),
        };
        super::messages::publish(conn, "", &message)?;
        let take = super::messages::GetRequest {
            count: 1,
            ackmode: "ack_requeue_false".into(),
            encoding: "auto".into(),
            truncate: None,
        };
        super::messages::get(conn, "aliveness-test", &take)
    };
    let refused = |(code, text): (u16, String)| match code {
        403 => ApiError::not_authorised(text),
        _ => ApiError::internal(text),
    };
    super::act::as_caller_with(&state, &caller, &vhost, test, refused).await?;
    Ok(Json(json!({"status": "ok"})))
}

/// `GET /metrics`: the Prometheus text `--metrics` serves, with no login (as RabbitMQ's
/// Prometheus plugin).
pub async fn metrics(State(state): State<Arc<Management>>) -> impl IntoResponse {
    let registry = Arc::clone(&state.registry);
    let body = tokio::task::spawn_blocking(move || crate::metrics::render(&registry))
        .await
        .unwrap_or_default();
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
}
