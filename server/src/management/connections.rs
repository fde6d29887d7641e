//! `/api/connections`, `/api/channels`, `/api/consumers`: what each live connection says
//! of itself when asked (`live.rs`), and `DELETE` of a connection (closed with 320). A
//! monitor or an administrator sees every connection; a management user its own.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use serde_json::{json, Value};

use super::auth::{Caller, Level};
use super::reply::{Answer, ApiError};
use super::Management;
use crate::live::{ChannelView, ConnectionView, LiveConnection};
use crate::names;

/// Every live connection the caller may see, with what it said of itself.
async fn visible(
    state: &Management,
    caller: &Caller,
) -> Vec<(Arc<LiveConnection>, ConnectionView)> {
    let mut seen = Vec::new();
    for live in state.settings.live.all() {
        let Some(view) = live.inspect().await else {
            continue;
        };
        if caller.level >= Level::Monitoring || view.user == caller.user.name {
            seen.push((live, view));
        }
    }
    seen
}

fn connection_json(state: &Management, live: &LiveConnection, view: &ConnectionView) -> Value {
    json!({
        "name": live.name(),
        "node": state.node,
        "type": "network",
        "protocol": "AMQP 0-9-1",
        "ssl": live.tls,
        "state": view.state,
        "user": view.user,
        "vhost": view.vhost,
        "peer_host": live.peer.ip().to_string(),
        "peer_port": live.peer.port(),
        "host": live.local.ip().to_string(),
        "port": live.local.port(),
        "channels": view.channels.len(),
        "client_properties": view.client_properties,
        "connected_at": live.connected_at,
        "timeout": view.timeout,
        "frame_max": view.frame_max,
        "channel_max": view.channel_max,
    })
}

fn channel_json(
    state: &Management,
    live: &LiveConnection,
    view: &ConnectionView,
    ch: &ChannelView,
) -> Value {
    json!({
        "name": format!("{} ({})", live.name(), ch.number),
        "number": ch.number,
        "node": state.node,
        "user": view.user,
        "vhost": view.vhost,
        "state": "running",
        "connection_details": {
            "name": live.name(),
            "peer_host": live.peer.ip().to_string(),
            "peer_port": live.peer.port(),
        },
        "consumer_count": ch.consumers.len(),
        "messages_unacknowledged": ch.messages_unacknowledged,
        "prefetch_count": ch.prefetch_count,
        "global_prefetch_count": ch.global_prefetch_count,
        "confirm": ch.confirm,
        "transactional": ch.transactional,
    })
}

/// `GET /api/connections`.
pub async fn all(State(state): State<Arc<Management>>, caller: Caller) -> Json<Value> {
    let items = (visible(&state, &caller).await.iter())
        .map(|(live, view)| connection_json(&state, live, view))
        .collect();
    Json(Value::Array(items))
}

/// `GET /api/vhosts/{vhost}/connections`.
pub async fn in_vhost(
    State(state): State<Arc<Management>>,
    caller: Caller,
    Path(vhost): Path<String>,
) -> Answer<Json<Value>> {
    caller.vhost_access(&vhost)?;
    let items = (visible(&state, &caller).await.iter())
        .filter(|(_, view)| view.vhost == vhost)
        .map(|(live, view)| connection_json(&state, live, view))
        .collect();
    Ok(Json(Value::Array(items)))
}

/// The connection called `name`, if the caller may see it.
async fn named(
    state: &Management,
    caller: &Caller,
    name: &str,
) -> Answer<(Arc<LiveConnection>, ConnectionView)> {
    (visible(state, caller).await.into_iter())
        .find(|(live, _)| live.name() == name)
        .ok_or_else(ApiError::not_found)
}

/// `GET /api/connections/{name}`.
pub async fn one(
    State(state): State<Arc<Management>>,
    caller: Caller,
    Path(name): Path<String>,
) -> Answer<Json<Value>> {
    let (live, view) = named(&state, &caller, &name).await?;
    Ok(Json(connection_json(&state, &live, &view)))
}

/// `DELETE /api/connections/{name}`: closes it with 320 CONNECTION_FORCED and the
/// `X-Reason` header's text (RabbitMQ's default words otherwise). A management user may
/// close its own; an administrator any.
pub async fn close(
    State(state): State<Arc<Management>>,
    caller: Caller,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Answer<StatusCode> {
    let (live, view) = named(&state, &caller, &name).await?;
    if !caller.is_administrator() && view.user != caller.user.name {
        return Err(ApiError::not_authorised(
            "User not authorised to access object",
        ));
    }
    let reason = (headers.get("x-reason").and_then(|v| v.to_str().ok()))
        .unwrap_or("Closed via management plugin")
        .to_string();
    live.close(reason);
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /api/connections/{name}/channels`.
pub async fn channels_of(
    State(state): State<Arc<Management>>,
    caller: Caller,
    Path(name): Path<String>,
) -> Answer<Json<Value>> {
    let (live, view) = named(&state, &caller, &name).await?;
    let items = (view.channels.iter())
        .map(|ch| channel_json(&state, &live, &view, ch))
        .collect();
    Ok(Json(Value::Array(items)))
}

/// `GET /api/channels`.
pub async fn channels(State(state): State<Arc<Management>>, caller: Caller) -> Json<Value> {
    let mut items = Vec::new();
    for (live, view) in visible(&state, &caller).await {
        for ch in &view.channels {
            items.push(channel_json(&state, &live, &view, ch));
        }
    }
    Json(Value::Array(items))
}

/// Every consumer of the connections the caller sees, of `vhost` if given.
pub async fn consumers(state: &Management, caller: &Caller, vhost: Option<&str>) -> Vec<Value> {
    let mut items = Vec::new();
    for (live, view) in visible(state, caller).await {
        if vhost.is_some_and(|v| v != view.vhost) || !caller.sees_vhost(&view.vhost) {
            continue;
        }
        for ch in &view.channels {
            for c in &ch.consumers {
                items.push(json!({
                    "consumer_tag": c.tag,
                    "queue": {"name": names::amqp(&c.queue), "vhost": view.vhost},
                    "channel_details": {
                        "name": format!("{} ({})", live.name(), ch.number),
                        "number": ch.number,
                        "connection_name": live.name(),
                        "peer_host": live.peer.ip().to_string(),
                        "peer_port": live.peer.port(),
                        "user": view.user,
                    },
                    "ack_required": c.ack_required,
                    "prefetch_count": ch.prefetch_count,
                    "exclusive": false,
                    "active": c.active,
                    "activity_status": if c.active { "up" } else { "waiting" },
                    "arguments": {},
                }));
            }
        }
    }
    items
}

/// `GET /api/consumers`.
pub async fn all_consumers(State(state): State<Arc<Management>>, caller: Caller) -> Json<Value> {
    Json(Value::Array(consumers(&state, &caller, None).await))
}

/// `GET /api/consumers/{vhost}`.
pub async fn consumers_in(
    State(state): State<Arc<Management>>,
    caller: Caller,
    Path(vhost): Path<String>,
) -> Answer<Json<Value>> {
    caller.vhost_access(&vhost)?;
    Ok(Json(Value::Array(
        consumers(&state, &caller, Some(&vhost)).await,
    )))
}
