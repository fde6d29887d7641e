//! Who is asking: a request's basic auth checked against the server's users (contract
//! §10), and what its tags let it see, as RabbitMQ's management plugin reads them.
//!
//! - `administrator` may do everything.
//! - `monitoring` reads node figures, every connection, channel and virtual host, and the
//!   queues and exchanges of the virtual hosts it has a permission entry in.
//! - `management` (and `policymaker`) sees the virtual hosts it has permissions in, and
//!   its own connections.
//! - A user with none of these tags is refused (401), as is a wrong password.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;
use base64::Engine as _;

use super::reply::ApiError;
use super::Management;
use crate::access::User;

/// The address a request came from, put in its extensions by the accept loop.
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub SocketAddr);

/// How much a user's tags let it see.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// `management` or `policymaker`: its own virtual hosts and connections.
    Management,
    /// `monitoring`: everything to read, nothing to change beyond its virtual hosts.
    Monitoring,
    /// `administrator`: everything.
    Administrator,
}

impl Level {
    /// The highest level `tags` give; `None` for a user the API refuses.
    pub fn of(tags: &[String]) -> Option<Level> {
        (tags.iter())
            .filter_map(|tag| match tag.as_str() {
                "administrator" => Some(Level::Administrator),
                "monitoring" => Some(Level::Monitoring),
                "management" | "policymaker" => Some(Level::Management),
                _ => None,
            })
            .max()
    }
}

/// The user a request is made as, logged in.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The user.
    pub user: Arc<User>,
    /// What its tags let it see.
    pub level: Level,
    /// The server's state, to ask what the user may do in a virtual host.
    state: Arc<Management>,
}

impl Caller {
    /// Whether the caller is an administrator.
    pub fn is_administrator(&self) -> bool {
        self.level == Level::Administrator
    }

    /// Refuses a caller that is not an administrator, as RabbitMQ does.
    pub fn require_administrator(&self) -> Result<(), ApiError> {
        match self.is_administrator() {
            true => Ok(()),
            false => Err(ApiError::not_authorised("Not administrator user")),
        }
    }

    /// Whether the caller sees the queues and exchanges of `vhost`: an administrator's,
    /// or one it has a permission entry in.
    pub fn sees_vhost(&self, vhost: &str) -> bool {
        self.is_administrator()
            || (self.state.settings.access)
                .permissions(&self.user.name, vhost)
                .is_some()
    }

    /// Whether the caller sees `vhost` in the list of virtual hosts: a monitor sees all.
    pub fn lists_vhost(&self, vhost: &str) -> bool {
        self.level >= Level::Monitoring || self.sees_vhost(vhost)
    }

    /// The virtual hosts whose queues and exchanges the caller sees, by name; only
    /// `vhost` if given.
    pub fn visible_vhosts(&self, vhost: Option<&str>) -> Vec<Arc<crate::vhost::VHost>> {
        let mut hosts = self.state.vhosts.all();
        hosts.retain(|h| vhost.is_none_or(|v| v == h.name) && self.sees_vhost(&h.name));
        hosts
    }

    /// Refuses a `vhost` the caller may not see, and one that does not exist (404).
    pub fn vhost_access(&self, vhost: &str) -> Result<(), ApiError> {
        if !self.state.settings.access.has_vhost(vhost) {
            return Err(ApiError {
                error: "not_found",
                reason: "vhost_not_found".to_string(),
                ..ApiError::not_found()
            });
        }
        match self.sees_vhost(vhost) {
            true => Ok(()),
            false => Err(ApiError::not_authorised(
                "User not authorised to access virtual host",
            )),
        }
    }
}

impl FromRequestParts<Arc<Management>> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<Management>,
    ) -> Result<Caller, ApiError> {
        let given = parts.headers.contains_key(header::AUTHORIZATION);
        let (name, password) = credentials(parts).ok_or(ApiError::login_failed(given))?;
        // A request with no peer (in-process) counts as local.
        let loopback = (parts.extensions.get::<Peer>()).is_none_or(|p| p.0.ip().is_loopback());
        let user = (state.settings.access)
            .log_in(&name, password.as_bytes(), loopback)
            .map_err(|_| {
                state.settings.metrics.auth_attempts_failed.inc();
                ApiError::login_failed(true)
            })?;
        let level =
            Level::of(&user.tags).ok_or_else(|| ApiError::not_authorised("Not management user"))?;
        Ok(Caller {
            user,
            level,
            state: Arc::clone(state),
        })
    }
}

/// The user name and password of a request's `Authorization: Basic` header.
fn credentials(parts: &Parts) -> Option<(String, String)> {
    let value = parts.headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, encoded) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (name, password) = text.split_once(':')?;
    Some((name.to_string(), password.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_highest_tag_counts_and_others_are_none() {
        let tags = |t: &[&str]| t.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            Level::of(&tags(&["monitoring", "administrator"])),
            Some(Level::Administrator)
        );
        assert_eq!(Level::of(&tags(&["policymaker"])), Some(Level::Management));
        assert_eq!(
            Level::of(&tags(&["monitoring", "impersonator"])),
            Some(Level::Monitoring)
        );
        assert_eq!(Level::of(&tags(&["impersonator"])), None);
        assert_eq!(Level::of(&[]), None);
    }
}
