//! What an administrator changes in users, permissions and virtual hosts: `PUT` and
//! `DELETE` of `/api/users/{name}`, `/api/permissions/{vhost}/{user}` and
//! `/api/vhosts/{name}`, and `POST /api/definitions` (an import). Each change is kept in
//! the data dir before it is answered (`access/changes.rs`). A deleted user's connections
//! and a deleted virtual host's are closed with 320, as RabbitMQ closes them; a deleted
//! virtual host's queues go with it.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde_json::Value;

use super::auth::Caller;
use super::reply::{Answer, ApiError};
use super::{body, Management};
use crate::access::{Algorithm, ChangeRefused, Definitions, Made, PasswordHash, User, UserDef};
use crate::vhost::VHost;

/// 201 or 204, as a change made or replaced something.
fn status(made: Made) -> StatusCode {
    match made {
        Made::Created => StatusCode::CREATED,
        Made::Replaced => StatusCode::NO_CONTENT,
    }
}

/// A refused change as the API answers it.
fn refused(why: ChangeRefused, not_found: &str) -> ApiError {
    match why {
        ChangeRefused::NotFound => ApiError::bad_request(not_found.to_string()),
        ChangeRefused::Invalid(reason) => ApiError::bad_request(reason),
        ChangeRefused::Storage(reason) => ApiError::internal(reason),
    }
}

/// Tags as RabbitMQ takes them: a list, or one string of names separated by commas.
fn tags(body: &Value) -> Answer<Vec<String>> {
    match body.get("tags") {
        None => Err(ApiError::bad_request("tags_not_present")),
        Some(Value::String(text)) => Ok((text.split(','))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(str::to_string)
            .collect()),
        Some(Value::Array(items)) => Ok(items
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect()),
        Some(other) => Err(ApiError::bad_request(format!("tags: {other}"))),
    }
}

/// `PUT /api/users/{name}`: `password` (hashed here) or `password_hash` (with
/// `hashing_algorithm`), and `tags`.
pub async fn put_user(
    State(state): State<Arc<Management>>,
    caller: Caller,
    Path(name): Path<String>,
    bytes: Bytes,
) -> Answer<StatusCode> {
    caller.require_administrator()?;
    let body = body::json(&bytes)?;
    let tags = tags(&body)?;
    let access = &state.settings.access;
    let made = match body::text(&body, "password")? {
        Some(password) => {
            let user = User {
                hash: Some(PasswordHash::new(Algorithm::Sha256, password.as_bytes())),
                tags,
                loopback_only: name == "guest",
                name,
            };
            access.put_user_as(user)
        }
        None => {
            let def = UserDef {
                name,
                password_hash: body::text(&body, "password_hash")?.unwrap_or_default(),
                hashing_algorithm: body::text(&body, "hashing_algorithm")?,
                tags,
            };
            access.put_user(&def)
        }
    };
    made.map(status).map_err(|e| refused(e, "user_not_found"))
}

/// `DELETE /api/users/{name}`: its connections are closed.
pub async fn delete_user(
    State(state): State<Arc<Management>>,
    caller: Caller,
    Path(name): Path<String>,
) -> Answer<StatusCode> {
    caller.require_administrator()?;
    match state.settings.access.delete_user(&name) {
        Ok(()) => {}
        Err(ChangeRefused::NotFound) => return Err(ApiError::not_found()),
        Err(e) => return Err(refused(e, "")),
    }
    close_where(&state, |user, _| user == name, "user deleted").await;
    Ok(StatusCode::NO_CONTENT)
}

/// `PUT /api/permissions/{vhost}/{user}`: `configure`, `write` and `read`, each a
/// regular expression (`""` allows nothing).
pub async fn put_permissions(
    State(state): State<Arc<Management>>,
    caller: Caller,
    Path((vhost, user)): Path<(String, String)>,
    bytes: Bytes,
) -> Answer<StatusCode> {
    caller.require_administrator()?;
    let body = body::json(&bytes)?;
    let missing: Vec<String> = (["configure", "write", "read"].iter())
        .filter(|key| !body.get(**key).is_some_and(Value::is_string))
        .map(|key| format!("{{key_missing,{key}}}"))
        .collect();
    if !missing.is_empty() {
        return Err(ApiError::bad_request(format!("[{}]", missing.join(","))));
    }
    let pattern = |key: &str| body[key].as_str().unwrap_or_default().to_string();
    let patterns = [pattern("configure"), pattern("write"), pattern("read")];
    let patterns = [
        patterns[0].as_str(),
        patterns[1].as_str(),
        patterns[2].as_str(),
    ];
    (state.settings.access)
        .put_permissions(&user, &vhost, patterns)
        .map(status)
        .map_err(|e| refused(e, "vhost_or_user_not_found"))
}

/// `DELETE /api/permissions/{vhost}/{user}`.
pub async fn delete_permissions(
    State(state): State<Arc<Management>>,
    caller: Caller,
    Path((vhost, user)): Path<(String, String)>,
) -> Answer<StatusCode> {
    caller.require_administrator()?;
    match state.settings.access.delete_permissions(&user, &vhost) {
        Ok(()) => Ok(StatusCode::NO_CONTENT),
        Err(ChangeRefused::NotFound) => Err(ApiError::not_found()),
        Err(e) => Err(refused(e, "")),
    }
}

/// `PUT /api/vhosts/{name}`: the caller gets every permission in a new one.
pub async fn put_vhost(
    State(state): State<Arc<Management>>,
    caller: Caller,
    Path(name): Path<String>,
) -> Answer<StatusCode> {
    caller.require_administrator()?;
    let made = (state.settings.access)
        .add_vhost(&name, Some(&caller.user.name))
        .map_err(|e| refused(e, ""))?;
    open_vhost(&state, &name).await?;
    Ok(status(made))
}

/// Makes the virtual host `name` serve, if it does not yet: its registries, what the
/// data dir keeps of it, and its tasks.
async fn open_vhost(state: &Arc<Management>, name: &str) -> Answer<()> {
    if state.vhosts.get(name).is_some() {
        return Ok(());
    }
    let opening = Arc::clone(state);
    let name = name.to_string();
    let vhost = tokio::task::spawn_blocking(move || {
        let dir = opening.settings.data_dir.as_deref();
        VHost::opened(&opening.settings, &name, dir, &opening.broker)
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))?
    .map_err(ApiError::internal)?;
    let vhost = state.vhosts.add(vhost);
    vhost.start(&state.broker);
    Ok(())
}

/// `DELETE /api/vhosts/{name}`: its connections are closed, its queues deleted (durable
/// ones from the disk too), its exchanges and bindings forgotten.
pub async fn delete_vhost(
    State(state): State<Arc<Management>>,
    caller: Caller,
    Path(name): Path<String>,
) -> Answer<StatusCode> {
    caller.require_administrator()?;
    match state.settings.access.delete_vhost(&name) {
        Ok(()) => {}
        Err(ChangeRefused::NotFound) => return Err(ApiError::not_found()),
        Err(e) => return Err(refused(e, "")),
    }
    let reason = format!("vhost '{name}' is deleted");
    close_where(&state, |_, vhost| vhost == name, &reason).await;
    let Some(vhost) = state.vhosts.remove(&name) else {
        return Ok(StatusCode::NO_CONTENT);
    };
    vhost.stop();
    let (broker, data_dir) = (state.broker.clone(), state.settings.data_dir.clone());
    tokio::task::spawn_blocking(move || {
        for queue_name in broker.queue_names() {
            if crate::names::vhost_of(&queue_name) == vhost.name {
                if let Some(queue) = broker.queue(&queue_name) {
                    vhost.forget_queue(&queue);
                    queue.close();
                }
            }
        }
        if let Some(dir) = data_dir.filter(|_| vhost.name != crate::access::DEFAULT_VHOST) {
            if let Ok(own) = crate::vhost::data_dir_of(&dir, &vhost.name) {
                let _ = std::fs::remove_dir_all(own);
            }
        }
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(StatusCode::NO_CONTENT)
}

/// Closes with 320 and `reason` every live connection whose (user, vhost) `which` picks.
async fn close_where(state: &Management, which: impl Fn(&str, &str) -> bool, reason: &str) {
    for live in state.settings.live.all() {
        if let Some(view) = live.inspect().await {
            if which(&view.user, &view.vhost) {
                live.close(reason.to_string());
            }
        }
    }
}

/// `POST /api/definitions`: users, virtual hosts and permissions added or replaced, then
/// queues, exchanges and bindings declared as `--definitions` declares them. 204.
pub async fn import(
    State(state): State<Arc<Management>>,
    caller: Caller,
    bytes: Bytes,
) -> Answer<StatusCode> {
    caller.require_administrator()?;
    let text =
        std::str::from_utf8(&bytes).map_err(|_| ApiError::bad_request("failed_to_parse_json"))?;
    let definitions =
        Definitions::parse(text).map_err(|_| ApiError::bad_request("failed_to_parse_json"))?;
    let access = &state.settings.access;
    for v in &definitions.vhosts {
        access
            .add_vhost(&v.name, None)
            .map_err(|e| refused(e, ""))?;
        open_vhost(&state, &v.name).await?;
    }
    for u in &definitions.users {
        access.put_user(u).map_err(|e| refused(e, ""))?;
    }
    for p in &definitions.permissions {
        let patterns = [p.configure.as_str(), p.write.as_str(), p.read.as_str()];
        (access.put_permissions(&p.user, &p.vhost, patterns))
            .map_err(|e| refused(e, "vhost_or_user_not_found"))?;
    }
    for (vhost, what) in (definitions.queues.iter().map(|q| (&q.vhost, &q.name)))
        .chain(definitions.exchanges.iter().map(|e| (&e.vhost, &e.name)))
        .chain(definitions.bindings.iter().map(|b| (&b.vhost, &b.source)))
    {
        if !access.has_vhost(vhost) {
            return Err(ApiError::bad_request(format!(
                "[\"no_such_vhost\",\"{vhost}\"] ({what})"
            )));
        }
    }
    let declaring = Arc::clone(&state);
    tokio::task::spawn_blocking(move || {
        let s = &declaring;
        crate::imports::declare(&s.broker, &s.settings, &s.vhosts, &definitions)
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))?
    .map_err(ApiError::bad_request)?;
    Ok(StatusCode::NO_CONTENT)
}
