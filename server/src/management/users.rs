//! `/api/users`, `/api/permissions` and `GET /api/definitions`: what the server's
//! [`Access`](crate::access::Access) holds (administrators only, as RabbitMQ), and the
//! definitions export in the format `--definitions` loads (contract §10): users,
//! virtual hosts and permissions, and every queue (but exclusive ones), exchange and
//! binding.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::Json;
use serde_json::{json, Value};

use super::auth::Caller;
use super::reply::{Answer, ApiError};
use super::{Management, RABBITMQ_VERSION};
use crate::access::{BindingDef, Definitions, ExchangeDef, QueueDef, UserDef};
use crate::names;

fn user_json(u: &UserDef) -> Value {
    json!({
        "name": u.name,
        "password_hash": u.password_hash,
        "hashing_algorithm": u.hashing_algorithm.as_deref().unwrap_or("rabbit_password_hashing_sha256"),
        "tags": u.tags,
        "limits": {},
    })
}

/// `GET /api/users`.
pub async fn all(State(state): State<Arc<Management>>, caller: Caller) -> Answer<Json<Value>> {
    caller.require_administrator()?;
    let d = state.settings.access.to_definitions();
    Ok(Json(d.users.iter().map(user_json).collect()))
}

/// `GET /api/users/{name}`.
pub async fn one(
    State(state): State<Arc<Management>>,
    caller: Caller,
    Path(name): Path<String>,
) -> Answer<Json<Value>> {
    caller.require_administrator()?;
    let d = state.settings.access.to_definitions();
    (d.users.iter().find(|u| u.name == name))
        .map(|u| Json(user_json(u)))
        .ok_or_else(ApiError::not_found)
}

/// The permission entries `keep` picks.
fn permissions(state: &Management, keep: impl Fn(&str, &str) -> bool) -> Value {
    let d = state.settings.access.to_definitions();
    (d.permissions.iter())
        .filter(|p| keep(&p.user, &p.vhost))
        .map(|p| serde_json::to_value(p).unwrap_or(Value::Null))
        .collect()
}

/// `GET /api/permissions`.
pub async fn all_permissions(
    State(state): State<Arc<Management>>,
    caller: Caller,
) -> Answer<Json<Value>> {
    caller.require_administrator()?;
    Ok(Json(permissions(&state, |_, _| true)))
}

/// `GET /api/vhosts/{vhost}/permissions`.
pub async fn permissions_in(
    State(state): State<Arc<Management>>,
    caller: Caller,
    Path(vhost): Path<String>,
) -> Answer<Json<Value>> {
    caller.require_administrator()?;
    if !state.settings.access.has_vhost(&vhost) {
        return Err(ApiError::not_found());
    }
    Ok(Json(permissions(&state, |_, v| v == vhost)))
}

/// `GET /api/users/{name}/permissions`.
pub async fn permissions_of(
    State(state): State<Arc<Management>>,
    caller: Caller,
    Path(user): Path<String>,
) -> Answer<Json<Value>> {
    caller.require_administrator()?;
    Ok(Json(permissions(&state, |u, _| u == user)))
}

/// `GET /api/permissions/{vhost}/{user}`.
pub async fn permission(
    State(state): State<Arc<Management>>,
    caller: Caller,
    Path((vhost, user)): Path<(String, String)>,
) -> Answer<Json<Value>> {
    caller.require_administrator()?;
    let found = permissions(&state, |u, v| u == user && v == vhost);
    match found.as_array().and_then(|a| a.first()) {
        Some(entry) => Ok(Json(entry.clone())),
        None => Err(ApiError::not_found()),
    }
}

/// `GET /api/definitions`: the export, as `rabbitmqctl export_definitions` writes it.
pub async fn export(State(state): State<Arc<Management>>, caller: Caller) -> Answer<Json<Value>> {
    caller.require_administrator()?;
    let mut d = state.settings.access.to_definitions();
    declared_into(&state, &mut d);
    let mut value = serde_json::to_value(&d).map_err(|e| ApiError::internal(e.to_string()))?;
    value["rabbit_version"] = json!(RABBITMQ_VERSION);
    value["rabbitmq_version"] = json!(RABBITMQ_VERSION);
    value["product_name"] = json!("leasemqd");
    value["product_version"] = json!(env!("CARGO_PKG_VERSION"));
    for key in ["queues", "exchanges", "bindings"] {
        if value.get(key).is_none() {
            value[key] = json!([]);
        }
    }
    value["policies"] = json!([]);
    value["parameters"] = json!([]);
    value["global_parameters"] = json!([]);
    value["topic_permissions"] = json!([]);
    Ok(Json(value))
}

/// The queues, exchanges and bindings of every virtual host, into `d`.
fn declared_into(state: &Management, d: &mut Definitions) {
    let hosts = state.vhosts.all();
    for host in hosts {
        let mut queues: Vec<QueueDef> = (host.declared.lock().expect("never poisoned").iter())
            .filter(|(_, declared)| !declared.exclusive)
            .map(|(name, declared)| QueueDef {
                name: names::amqp(name).into_owned(),
                vhost: host.name.clone(),
                durable: declared.durable,
                auto_delete: declared.auto_delete,
                arguments: (*declared.arguments).clone(),
            })
            .collect();
        queues.sort_by(|a, b| a.name.cmp(&b.name));
        d.queues.extend(queues);
        let exchanges = host.exchanges.lock().expect("never poisoned");
        for (name, shape) in exchanges.list() {
            if name.starts_with("amq.") {
                continue;
            }
            let mut arguments = serde_json::Map::new();
            if let Some(alternate) = &shape.alternate {
                arguments.insert("alternate-exchange".into(), json!(alternate));
            }
            d.exchanges.push(ExchangeDef {
                name,
                vhost: host.name.clone(),
                kind: format!("{:?}", shape.kind).to_lowercase(),
                durable: shape.durable,
                auto_delete: shape.auto_delete,
                internal: shape.internal,
                arguments,
            });
        }
        for b in exchanges.bindings() {
            let destination = match b.to_queue {
                true => names::amqp(&b.destination).into_owned(),
                false => b.destination.clone(),
            };
            d.bindings.push(BindingDef {
                source: b.source,
                vhost: host.name.clone(),
                destination,
                destination_type: if b.to_queue { "queue" } else { "exchange" }.to_string(),
                routing_key: b.routing_key,
                arguments: b.arguments,
            });
        }
    }
}
