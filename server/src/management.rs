//! `--management ADDR`: RabbitMQ's management HTTP API (contract §11), the subset that
//! `rabbitmqadmin`, Flower, KEDA and the Prometheus exporters use, with RabbitMQ's paths,
//! JSON field names, status codes and user tags; `/metrics` too.
//!
//! The pieces:
//!
//! - `http` accepts connections (plain or TLS) and serves each with hyper's HTTP/1.1,
//!   which bounds its header count, buffer and header read time; a request body is bounded
//!   in size and a request in time.
//! - `auth` checks a request's basic auth against the server's users (contract §10) and
//!   what the user's tags let it see and do.
//! - `overview`, `queues`: the resources, each a handler that reads the broker and the
//!   virtual hosts and answers JSON.
//! - `rates` samples every queue's counters every few seconds, as RabbitMQ's statistics
//!   database does, for the `*_details.rate` figures and the console's charts.
//! - `console` serves the web console at `/`: one page in the binary, over the API.
//!
//! What it must not know: AMQP frames and connections' insides. Reads go to the broker
//! and the virtual hosts' registries.

mod act;
mod auth;
mod bindings;
mod body;
mod changes;
mod connections;
mod console;
mod exchanges;
mod http;
mod messages;
mod overview;
mod queue_ops;
mod queues;
mod rates;
mod reply;
mod users;

use std::sync::Arc;
use std::time::Duration;

use axum::routing::{delete, get, post};
use axum::Router;
use leasemq::Broker;
use prometheus_client::registry::Registry;

use crate::settings::Settings;
use crate::vhost::VHosts;

pub use http::serve;
pub use rates::Rates;

/// The RabbitMQ version whose management API this one copies: what `rabbitmq_version`
/// and `management_version` say, for tools that check it.
pub const RABBITMQ_VERSION: &str = "3.10.8";

/// How often the rates sample the queues (RabbitMQ's `collect_statistics_interval`).
pub const SAMPLE_EVERY: Duration = Duration::from_secs(5);

/// What the handlers read: the broker, the server's settings and virtual hosts, the
/// sampled rates, and the metrics registry `/metrics` renders.
#[derive(Debug)]
pub struct Management {
    /// The broker the queues live in.
    pub broker: Broker,
    /// The server's settings: its users, alarms and counters.
    pub settings: Arc<Settings>,
    /// Its virtual hosts.
    pub vhosts: Arc<VHosts>,
    /// The queues' sampled rates.
    pub rates: Arc<Rates>,
    /// What `/metrics` renders.
    pub registry: Arc<Registry>,
    /// This node's name, as RabbitMQ's `rabbit@host`.
    pub node: String,
    /// The listeners the overview lists: (protocol, port).
    pub listeners: Vec<(&'static str, u16)>,
}

impl Management {
    /// The management side of a server.
    pub fn new(broker: Broker, settings: Arc<Settings>, vhosts: Arc<VHosts>) -> Management {
        let registry = Arc::new(settings.metrics.registry(broker.clone()));
        Management {
            rates: Arc::new(Rates::default()),
            broker,
            settings,
            vhosts,
            registry,
            node: node_name(),
            listeners: Vec::new(),
        }
    }
}

/// Binds `addr` and serves `management` there (over TLS with `tls`), its rates sampled
/// from now on; the ready line's words for it.
///
/// # Errors
///
/// The address cannot be bound.
pub async fn start(
    addr: std::net::SocketAddr,
    tls: Option<Arc<crate::tls::Tls>>,
    mut management: Management,
) -> Result<String, String> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr} for --management: {e}"))?;
    let at = listener.local_addr().map_err(|e| e.to_string())?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    management.listeners.push(("http", at.port()));
    tokio::spawn(serve(listener, Arc::new(management), tls));
    Ok(format!("; management API on {scheme}://{at}/api/"))
}

/// `text` percent-encoded for a path segment: all but RFC 3986's unreserved characters
/// (`/` as `%2F`). RabbitMQ's `properties_key` is a routing key written so, and
/// leasemqctl writes path segments so.
pub fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(b as char);
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// `leasemqd@` and the host's name.
fn node_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string());
    format!("leasemqd@{host}")
}

/// Every route, over `state`.
pub fn router(state: Arc<Management>) -> Router {
    Router::new()
        .route("/api/overview", get(overview::overview))
        .route("/api/whoami", get(overview::whoami))
        .route("/api/vhosts", get(overview::vhosts))
        .route("/api/health/checks/alarms", get(overview::alarms))
        .route("/api/aliveness-test/{vhost}", get(overview::aliveness))
        .route("/metrics", get(overview::metrics))
        .route("/", get(console::index))
        .route("/console.js", get(console::script))
        .route("/console.css", get(console::style))
        .merge(queue_routes())
        .merge(exchange_routes())
        .merge(connection_routes())
        .merge(access_routes())
        .fallback(reply::not_found)
        .layer(axum::middleware::from_fn(reply::bounded))
        .with_state(state)
}

/// `/api/queues`.
fn queue_routes() -> Router<Arc<Management>> {
    Router::new()
        .route("/api/queues", get(queues::all))
        .route("/api/queues/{vhost}", get(queues::in_vhost))
        .route(
            "/api/queues/{vhost}/{name}",
            get(queues::one)
                .put(queue_ops::put)
                .delete(queue_ops::delete),
        )
        .route(
            "/api/queues/{vhost}/{name}/contents",
            delete(queue_ops::purge),
        )
        .route("/api/queues/{vhost}/{name}/get", post(queue_ops::get))
        .route(
            "/api/queues/{vhost}/{name}/bindings",
            get(bindings::of_queue),
        )
}

/// `/api/exchanges` and `/api/bindings`.
fn exchange_routes() -> Router<Arc<Management>> {
    Router::new()
        .route("/api/exchanges", get(exchanges::all))
        .route("/api/exchanges/{vhost}", get(exchanges::in_vhost))
        .route(
            "/api/exchanges/{vhost}/{name}",
            get(exchanges::one)
                .put(exchanges::put)
                .delete(exchanges::delete),
        )
        .route(
            "/api/exchanges/{vhost}/{name}/publish",
            post(exchanges::publish),
        )
        .route("/api/bindings", get(bindings::all))
        .route("/api/bindings/{vhost}", get(bindings::in_vhost))
        .route(
            "/api/bindings/{vhost}/e/{source}/{kind}/{destination}",
            get(bindings::between).post(bindings::create),
        )
        .route(
            "/api/bindings/{vhost}/e/{source}/{kind}/{destination}/{props}",
            get(bindings::one).delete(bindings::delete),
        )
}

/// `/api/connections`, `/api/channels`, `/api/consumers`.
fn connection_routes() -> Router<Arc<Management>> {
    Router::new()
        .route("/api/connections", get(connections::all))
        .route(
            "/api/connections/{name}",
            get(connections::one).delete(connections::close),
        )
        .route(
            "/api/connections/{name}/channels",
            get(connections::channels_of),
        )
        .route(
            "/api/vhosts/{vhost}/connections",
            get(connections::in_vhost),
        )
        .route("/api/channels", get(connections::channels))
        .route("/api/consumers", get(connections::all_consumers))
        .route("/api/consumers/{vhost}", get(connections::consumers_in))
}

/// `/api/users`, `/api/permissions`, `/api/definitions`.
fn access_routes() -> Router<Arc<Management>> {
    Router::new()
        .route("/api/users", get(users::all))
        .route(
            "/api/users/{name}",
            get(users::one)
                .put(changes::put_user)
                .delete(changes::delete_user),
        )
        .route("/api/users/{name}/permissions", get(users::permissions_of))
        .route("/api/permissions", get(users::all_permissions))
        .route(
            "/api/permissions/{vhost}/{user}",
            get(users::permission)
                .put(changes::put_permissions)
                .delete(changes::delete_permissions),
        )
        .route(
            "/api/vhosts/{vhost}",
            get(overview::vhost)
                .put(changes::put_vhost)
                .delete(changes::delete_vhost),
        )
        .route(
            "/api/vhosts/{vhost}/permissions",
            get(users::permissions_in),
        )
        .route("/api/definitions", get(users::export).post(changes::import))
}
