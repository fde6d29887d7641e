//! `/api/bindings`: every binding of the virtual hosts the caller sees, those of one
//! exchange or queue, and `POST`/`DELETE` of one between an exchange and a queue or
//! exchange. A binding is named in a path by its `properties_key`, as RabbitMQ's: its
//! routing key (`~` for an empty one), and with arguments `~` and a digest of them.

use std::sync::Arc;

use amq_protocol::protocol::{exchange, queue, AMQPClass};
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use sha2::Digest as _;

use super::act::as_caller;
use super::auth::Caller;
use super::reply::{Answer, ApiError};
use super::{body, messages, Management};
use crate::names;

/// A binding's `properties_key`: its routing key percent-encoded (as RabbitMQ's: `a.#`
/// is `a.%23`, so a client encodes it once more in a path).
pub fn properties_key(routing_key: &str, arguments: &Map<String, Value>) -> String {
    let quoted = super::percent_encode(routing_key);
    let key = if routing_key.is_empty() { "~" } else { &quoted };
    if arguments.is_empty() {
        return key.to_string();
    }
    let digest = sha2::Sha256::digest(Value::Object(arguments.clone()).to_string());
    let short: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
    format!("{key}~{short}")
}

fn binding_json(
    vhost: &str,
    source: &str,
    destination: &str,
    to_queue: bool,
    key: &str,
    arguments: Map<String, Value>,
) -> Value {
    json!({
        "source": source,
        "vhost": vhost,
        "destination": destination,
        "destination_type": if to_queue { "queue" } else { "exchange" },
        "routing_key": key,
        "properties_key": properties_key(key, &arguments),
        "arguments": arguments,
    })
}

/// Every binding of the virtual hosts the caller sees (of `vhost` only, if given): the
/// default exchange's to each queue first, as RabbitMQ lists them.
fn list(caller: &Caller, vhost: Option<&str>) -> Vec<Value> {
    let mut items = Vec::new();
    for host in caller.visible_vhosts(vhost) {
        let mut queues: Vec<String> = (host.declared.lock().expect("never poisoned").keys())
            .map(|name| names::amqp(name).into_owned())
            .collect();
        queues.sort();
        for queue in queues {
            items.push(binding_json(
                &host.name,
                "",
                &queue,
                true,
                &queue,
                Map::new(),
            ));
        }
        let bindings = host.exchanges.lock().expect("never poisoned").bindings();
        for b in bindings {
            let destination = match b.to_queue {
                true => names::amqp(&b.destination).into_owned(),
                false => b.destination.clone(),
            };
            items.push(binding_json(
                &host.name,
                &b.source,
                &destination,
                b.to_queue,
                &b.routing_key,
                b.arguments,
            ));
        }
    }
    items
}

/// `GET /api/bindings`.
pub async fn all(caller: Caller) -> Json<Value> {
    Json(Value::Array(list(&caller, None)))
}

/// `GET /api/bindings/{vhost}`.
pub async fn in_vhost(caller: Caller, Path(vhost): Path<String>) -> Answer<Json<Value>> {
    caller.vhost_access(&vhost)?;
    Ok(Json(Value::Array(list(&caller, Some(&vhost)))))
}

/// `GET /api/queues/{vhost}/{name}/bindings`.
pub async fn of_queue(
    caller: Caller,
    Path((vhost, name)): Path<(String, String)>,
) -> Answer<Json<Value>> {
    caller.vhost_access(&vhost)?;
    let items = (list(&caller, Some(&vhost)).into_iter())
        .filter(|b| b["destination_type"] == "queue" && b["destination"] == name.as_str())
        .collect();
    Ok(Json(Value::Array(items)))
}

/// `GET /api/bindings/{vhost}/e/{source}/{q|e}/{destination}`.
pub async fn between(
    caller: Caller,
    Path((vhost, source, kind, destination)): Path<(String, String, String, String)>,
) -> Answer<Json<Value>> {
    caller.vhost_access(&vhost)?;
    let to_queue = to_queue(&kind)?;
    let items = (list(&caller, Some(&vhost)).into_iter())
        .filter(|b| {
            b["source"] == source.as_str()
                && b["destination"] == destination.as_str()
                && (b["destination_type"] == "queue") == to_queue
        })
        .collect();
    Ok(Json(Value::Array(items)))
}

fn to_queue(kind: &str) -> Answer<bool> {
    match kind {
        "q" => Ok(true),
        "e" => Ok(false),
        _ => Err(ApiError::not_found()),
    }
}

/// The bind or unbind method of a binding.
fn method(
    bind: bool,
    to_queue: bool,
    source: &str,
    destination: &str,
    key: &str,
    arguments: amq_protocol::types::FieldTable,
) -> AMQPClass {
    let (source, destination, key) = (source.into(), destination.into(), key.into());
    match (bind, to_queue) {
        (true, true) => AMQPClass::Queue(queue::AMQPMethod::Bind(queue::Bind {
            queue: destination,
            exchange: source,
            routing_key: key,
            nowait: false,
            arguments,
        })),
        (false, true) => AMQPClass::Queue(queue::AMQPMethod::Unbind(queue::Unbind {
            queue: destination,
            exchange: source,
            routing_key: key,
            arguments,
        })),
        (true, false) => AMQPClass::Exchange(exchange::AMQPMethod::Bind(exchange::Bind {
            destination,
            source,
            routing_key: key,
            nowait: false,
            arguments,
        })),
        (false, false) => AMQPClass::Exchange(exchange::AMQPMethod::Unbind(exchange::Unbind {
            destination,
            source,
            routing_key: key,
            nowait: false,
            arguments,
        })),
    }
}

/// `POST /api/bindings/{vhost}/e/{source}/{q|e}/{destination}`: 201, with the new
/// binding's `properties_key` in `Location`.
pub async fn create(
    State(state): State<Arc<Management>>,
    caller: Caller,
    Path((vhost, source, kind, destination)): Path<(String, String, String, String)>,
    bytes: Bytes,
) -> Answer<Response> {
    caller.vhost_access(&vhost)?;
    let to_queue = to_queue(&kind)?;
    let body = body::json(&bytes)?;
    let key = body::text(&body, "routing_key")?.unwrap_or_default();
    let arguments_json = match body.get("arguments") {
        Some(Value::Object(map)) => map.clone(),
        _ => Map::new(),
    };
    let arguments = messages::arguments(&body)?;
    // Relative, as RabbitMQ's: the destination, then the new binding's properties_key.
    let location = format!("{destination}/{}", properties_key(&key, &arguments_json));
    as_caller(&state, &caller, &vhost, move |conn| {
        conn.method(method(
            true,
            to_queue,
            &source,
            &destination,
            &key,
            arguments,
        ))
    })
    .await?;
    Ok((StatusCode::CREATED, [(header::LOCATION, location)]).into_response())
}

/// The binding of `source` to `destination` whose `properties_key` is `props`.
fn find(caller: &Caller, path: &BindingPath) -> Answer<Value> {
    let (vhost, source, kind, destination, props) = path;
    let to_queue = to_queue(kind)?;
    (list(caller, Some(vhost)).into_iter())
        .find(|b| {
            b["source"] == source.as_str()
                && b["destination"] == destination.as_str()
                && (b["destination_type"] == "queue") == to_queue
                && b["properties_key"] == props.as_str()
        })
        .ok_or_else(ApiError::not_found)
}

/// A binding's path: vhost, source, `q` or `e`, destination, `properties_key`.
type BindingPath = (String, String, String, String, String);

/// `GET /api/bindings/{vhost}/e/{source}/{q|e}/{destination}/{props}`.
pub async fn one(caller: Caller, Path(path): Path<BindingPath>) -> Answer<Json<Value>> {
    caller.vhost_access(&path.0)?;
    find(&caller, &path).map(Json)
}

/// `DELETE /api/bindings/{vhost}/e/{source}/{q|e}/{destination}/{props}`: 204, or 404
/// where no binding has that `properties_key`.
pub async fn delete(
    State(state): State<Arc<Management>>,
    caller: Caller,
    Path(path): Path<BindingPath>,
) -> Answer<StatusCode> {
    caller.vhost_access(&path.0)?;
    let found = find(&caller, &path)?;
    let (vhost, source, kind, destination, _) = path;
    let to_queue = to_queue(&kind)?;
    let key = found["routing_key"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let arguments = messages::arguments(&found)?;
    as_caller(&state, &caller, &vhost, move |conn| {
        conn.method(method(
            false,
            to_queue,
            &source,
            &destination,
            &key,
            arguments,
        ))
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}
