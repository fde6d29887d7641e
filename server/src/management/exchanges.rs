//! `/api/exchanges`: list, one, `PUT` (declare), `DELETE` and `POST …/publish`. The
//! default exchange is listed with the name `""` and named `amq.default` in paths.

use std::collections::HashMap;
use std::sync::Arc;

use amq_protocol::protocol::{exchange, AMQPClass};
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value};

use super::act::{as_caller, as_caller_with, in_message};
use super::auth::Caller;
use super::messages::{self, Publish};
use super::queues::Listing;
use super::reply::{Answer, ApiError};
use super::{body, Management};
use crate::exchange::{Kind, Shape};

/// The name a path gives the default exchange.
const DEFAULT_IN_PATH: &str = "amq.default";

/// The exchange a path names.
fn from_path(name: &str) -> &str {
    if name == DEFAULT_IN_PATH {
        ""
    } else {
        name
    }
}

fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Direct => "direct",
        Kind::Fanout => "fanout",
        Kind::Topic => "topic",
        Kind::Headers => "headers",
    }
}

/// One exchange as the API lists it.
fn exchange_json(vhost: &str, name: &str, shape: &Shape) -> Value {
    let mut arguments = serde_json::Map::new();
    if let Some(alternate) = &shape.alternate {
        arguments.insert(
            "alternate-exchange".into(),
            Value::String(alternate.clone()),
        );
    }
    json!({
        "name": name,
        "vhost": vhost,
        "type": kind_name(shape.kind),
        "durable": shape.durable,
        "auto_delete": shape.auto_delete,
        "internal": shape.internal,
        "arguments": arguments,
    })
}

/// Every exchange of the virtual hosts the caller sees (of `vhost` only, if given).
fn list(caller: &Caller, vhost: Option<&str>) -> Vec<Value> {
    let mut items = Vec::new();
    for host in caller.visible_vhosts(vhost) {
        let default = Shape {
            durable: true,
            ..Shape::of(Kind::Direct)
        };
        items.push(exchange_json(&host.name, "", &default));
        let exchanges = host.exchanges.lock().expect("never poisoned");
        for (name, shape) in exchanges.list() {
            items.push(exchange_json(&host.name, &name, &shape));
        }
    }
    items
}

/// `GET /api/exchanges`.
pub async fn all(caller: Caller, Query(listing): Query<Listing>) -> Answer<Json<Value>> {
    Ok(Json(listing.answer(list(&caller, None))?))
}

/// `GET /api/exchanges/{vhost}`.
pub async fn in_vhost(
    caller: Caller,
    Path(vhost): Path<String>,
    Query(listing): Query<Listing>,
) -> Answer<Json<Value>> {
    caller.vhost_access(&vhost)?;
    Ok(Json(listing.answer(list(&caller, Some(&vhost)))?))
}

/// `GET /api/exchanges/{vhost}/{name}`.
pub async fn one(
    caller: Caller,
    Path((vhost, name)): Path<(String, String)>,
) -> Answer<Json<Value>> {
    caller.vhost_access(&vhost)?;
    let wanted = from_path(&name);
    (list(&caller, Some(&vhost)).into_iter())
        .find(|x| x["name"] == wanted)
        .map(Json)
        .ok_or_else(ApiError::not_found)
}

/// Whether the exchange `name` exists in `vhost`.
fn exists(state: &Management, vhost: &str, name: &str) -> Answer<bool> {
    let host = state.vhosts.get(vhost).ok_or_else(ApiError::not_found)?;
    let exchanges = host.exchanges.lock().expect("never poisoned");
    Ok(exchanges.exists(name))
}

/// `PUT /api/exchanges/{vhost}/{name}`: 201 when made, 204 when there as declared.
pub async fn put(
    State(state): State<Arc<Management>>,
    caller: Caller,
    Path((vhost, name)): Path<(String, String)>,
    bytes: Bytes,
) -> Answer<StatusCode> {
    caller.vhost_access(&vhost)?;
    let body = body::json(&bytes)?;
    let kind = body::text(&body, "type")?.unwrap_or_else(|| "direct".to_string());
    let declare = exchange::Declare {
        exchange: name.as_str().into(),
        kind: kind.as_str().into(),
        durable: messages::is_set(&body, "durable")?,
        auto_delete: messages::is_set(&body, "auto_delete")?,
        internal: messages::is_set(&body, "internal")?,
        arguments: messages::arguments(&body)?,
        ..exchange::Declare::default()
    };
    let existed = exists(&state, &vhost, &name)?;
    as_caller(&state, &caller, &vhost, move |conn| {
        conn.method(AMQPClass::Exchange(exchange::AMQPMethod::Declare(declare)))
    })
    .await?;
    Ok(if existed {
        StatusCode::NO_CONTENT
    } else {
        StatusCode::CREATED
    })
}

/// `DELETE /api/exchanges/{vhost}/{name}` (with `if-unused=true`).
pub async fn delete(
    State(state): State<Arc<Management>>,
    caller: Caller,
    Path((vhost, name)): Path<(String, String)>,
    Query(query): Query<HashMap<String, String>>,
) -> Answer<StatusCode> {
    caller.vhost_access(&vhost)?;
    if !exists(&state, &vhost, from_path(&name))? {
        return Err(ApiError::not_found());
    }
    let delete = exchange::Delete {
        exchange: from_path(&name).into(),
        if_unused: query.get("if-unused").is_some_and(|v| v == "true"),
        nowait: false,
    };
    as_caller(&state, &caller, &vhost, move |conn| {
        conn.method(AMQPClass::Exchange(exchange::AMQPMethod::Delete(delete)))
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /api/exchanges/{vhost}/{name}/publish`: `{"routed": true}` when a queue took it;
/// a refusal (an exchange that is not there, no write permission) is a 400 naming the
/// AMQP code, as RabbitMQ's.
pub async fn publish(
    State(state): State<Arc<Management>>,
    caller: Caller,
    Path((vhost, name)): Path<(String, String)>,
    bytes: Bytes,
) -> Answer<Json<Value>> {
    caller.vhost_access(&vhost)?;
    let message = Publish::read(&body::json(&bytes)?)?;
    let name = from_path(&name).to_string();
    let publish =
        move |conn: &mut crate::internal::Internal| messages::publish(conn, &name, &message);
    let routed = as_caller_with(&state, &caller, &vhost, publish, in_message).await?;
    Ok(Json(json!({ "routed": routed })))
}
