//! What the API does to a queue: `PUT` (declare), `DELETE` (with `if-empty`, `if-unused`),
//! `DELETE …/contents` (purge) and `POST …/get`, each as the caller (`act.rs`).

use std::collections::HashMap;
use std::sync::Arc;

use amq_protocol::protocol::{queue, AMQPClass};
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use serde_json::Value;

use super::act::{as_caller, as_caller_with, in_message};
use super::auth::Caller;
use super::messages::{self, GetRequest};
use super::reply::{Answer, ApiError};
use super::{body, Management};

/// Whether the queue a client of `vhost` calls `name` exists.
async fn exists(state: &Arc<Management>, vhost: &str, name: &str) -> Answer<bool> {
    let Some(host) = state.vhosts.get(vhost) else {
        return Err(ApiError::not_found());
    };
    let broker = state.broker.clone();
    let name = host.broker_name(name).into_owned();
    (tokio::task::spawn_blocking(move || broker.queue(&name).is_some()).await)
        .map_err(|e| ApiError::internal(e.to_string()))
}

/// `PUT /api/queues/{vhost}/{name}`: 201 when it made the queue, 204 when it was there
/// as declared; 400 for an inequivalent redeclare.
pub async fn put(
    State(state): State<Arc<Management>>,
    caller: Caller,
    Path((vhost, name)): Path<(String, String)>,
    bytes: Bytes,
) -> Answer<StatusCode> {
    caller.vhost_access(&vhost)?;
    let body = body::json(&bytes)?;
    let declare = queue::Declare {
        queue: name.as_str().into(),
        durable: messages::is_set(&body, "durable")?,
        auto_delete: messages::is_set(&body, "auto_delete")?,
        arguments: messages::arguments(&body)?,
        ..queue::Declare::default()
    };
    let existed = exists(&state, &vhost, &name).await?;
    as_caller(&state, &caller, &vhost, move |conn| {
        conn.method(AMQPClass::Queue(queue::AMQPMethod::Declare(declare)))
    })
    .await?;
    Ok(if existed {
        StatusCode::NO_CONTENT
    } else {
        StatusCode::CREATED
    })
}

/// `DELETE /api/queues/{vhost}/{name}`: 204, or 404 for a queue that is not there; with
/// `if-empty=true` or `if-unused=true`, 400 where it is not.
pub async fn delete(
    State(state): State<Arc<Management>>,
    caller: Caller,
    Path((vhost, name)): Path<(String, String)>,
    Query(query): Query<HashMap<String, String>>,
) -> Answer<StatusCode> {
    caller.vhost_access(&vhost)?;
    if !exists(&state, &vhost, &name).await? {
        return Err(ApiError::not_found());
    }
    let delete = queue::Delete {
        queue: name.as_str().into(),
        if_unused: query.get("if-unused").is_some_and(|v| v == "true"),
        if_empty: query.get("if-empty").is_some_and(|v| v == "true"),
        nowait: false,
    };
    as_caller(&state, &caller, &vhost, move |conn| {
        conn.method(AMQPClass::Queue(queue::AMQPMethod::Delete(delete)))
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE /api/queues/{vhost}/{name}/contents`: the ready messages go, the unacked stay
/// with their consumers (AMQP's `queue.purge`).
pub async fn purge(
    State(state): State<Arc<Management>>,
    caller: Caller,
    Path((vhost, name)): Path<(String, String)>,
) -> Answer<StatusCode> {
    caller.vhost_access(&vhost)?;
    if !exists(&state, &vhost, &name).await? {
        return Err(ApiError::not_found());
    }
    let purge = queue::Purge {
        queue: name.as_str().into(),
        nowait: false,
    };
    as_caller(&state, &caller, &vhost, move |conn| {
        conn.method(AMQPClass::Queue(queue::AMQPMethod::Purge(purge)))
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /api/queues/{vhost}/{name}/get`: up to `count` messages, peeked at
/// (`ack_requeue_true`: back in the queue, redelivered) or taken.
pub async fn get(
    State(state): State<Arc<Management>>,
    caller: Caller,
    Path((vhost, name)): Path<(String, String)>,
    bytes: Bytes,
) -> Answer<Json<Value>> {
    caller.vhost_access(&vhost)?;
    let request = GetRequest::read(&body::json(&bytes)?)?;
    if !exists(&state, &vhost, &name).await? {
        return Err(ApiError::not_found());
    }
    let get = move |conn: &mut crate::internal::Internal| messages::get(conn, &name, &request);
    let taken = as_caller_with(&state, &caller, &vhost, get, in_message).await?;
    Ok(Json(Value::Array(taken)))
}
