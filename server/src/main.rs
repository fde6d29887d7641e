//! `leasemqd`: serves a leasemq broker over AMQP 0-9-1 (contract §8).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use leasemq::{Broker, Cluster, ClusterStatus};
use leasemq_replica::link::{admin_call, AdminCall};
use leasemq_server::access::{read_definitions, Access, Definitions};
use leasemq_server::imports;
use leasemq_server::management::{self, Management};
use leasemq_server::serve::Listeners;
use leasemq_server::tls::{self, Tls, TlsFiles};
use leasemq_server::vhost::VHosts;
use leasemq_server::{resources, serve, Settings};
use mimalloc::MiMalloc;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

#[global_allocator]
static GLOBAL: MiMalloc = MiMalloc;

/// How long mimalloc keeps freed memory before it returns it to the system. Its default
/// (a second for pages) returned the memory of acked messages that new messages needed a
/// moment later, and every page came back through a fault on a shard thread: with a
/// million leases, runs of faults held single puts for up to 28 ms. Ten seconds keeps the
/// memory a running broker churns through, and still gives back what a drained queue
/// held.
const ALLOCATOR_PURGE_DELAY_MS: std::ffi::c_long = 10_000;
/// `mi_option_purge_delay` in mimalloc.h's `mi_option_t` (the same in v2 and v3); the
/// Rust bindings do not name it.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Sets mimalloc's purge delay; see [`ALLOCATOR_PURGE_DELAY_MS`].
fn tune_allocator() {
    // SAFETY: `mi_option_set` stores one value in mimalloc's option table; it may be called
    // at any time, from any thread, and takes no pointers.
    unsafe {
        libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, ALLOCATOR_PURGE_DELAY_MS);
    }
}

/// leasemqd: leasemq queues for AMQP 0-9-1 clients (pika, lapin, amqplib).
#[derive(Parser, Debug)]
#[command(version, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    args: Args,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Talks to a running node of a cluster over its node link (contract §9).
    Cluster {
        #[command(subcommand)]
        action: ClusterAction,
    },
}

#[derive(Subcommand, Debug)]
enum ClusterAction {
    /// Forms the cluster: every peer becomes a voter of every shard's group. Once per
    /// cluster, on any node; on a formed cluster it does nothing.
    Init {
        #[command(flatten)]
        node: NodeAddress,
    },
    /// Where the cluster stands, as one node sees it: per shard its leader, term, voters,
    /// committed and applied index; per peer whether it is reachable.
    Status {
        #[command(flatten)]
        node: NodeAddress,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// How `leasemqd cluster` reaches a node.
#[derive(clap::Args, Debug)]
struct NodeAddress {
    /// The node's node link (its --raft-listen or --raft-advertise address).
    #[arg(long, value_name = "ADDR")]
    raft: String,
    /// The file holding the cluster's secret.
    #[arg(long, value_name = "FILE")]
    cluster_secret_file: PathBuf,
    /// Where the node link runs TLS: a certificate the cluster's CA signed (PEM)...
    #[arg(long, value_name = "FILE", requires_all = ["tls_key", "tls_client_ca"])]
    tls_cert: Option<PathBuf>,
    /// ... its key ...
    #[arg(long, value_name = "FILE")]
    tls_key: Option<PathBuf>,
    /// ... and the cluster's CA, which the node's certificate must chain to.
    #[arg(long, value_name = "FILE")]
    tls_client_ca: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
struct Args {
    /// Address to serve plain AMQP on (port 0 picks a free port; the ready line names it),
    /// or `none` for no plain listener (with --tls-listen).
    #[arg(long, value_name = "ADDR|none", default_value = "127.0.0.1:5672", value_parser = parse_listen)]
    listen: Listen,
    /// Address to serve AMQP over TLS on (RabbitMQ's 5671), with --tls-cert and --tls-key.
    #[arg(long, value_name = "ADDR")]
    tls_listen: Option<SocketAddr>,
    /// The server's certificate chain (PEM), its own certificate first. SIGHUP reads it
    /// again, for the connections accepted from then on.
    #[arg(long, value_name = "FILE")]
    tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM: PKCS#8, PKCS#1 or SEC1). SIGHUP reads it again.
    #[arg(long, value_name = "FILE")]
    tls_key: Option<PathBuf>,
    /// Requires every TLS client to show a certificate this CA (PEM) signed (RabbitMQ's
    /// verify_peer with fail_if_no_peer_cert), and offers EXTERNAL: the certificate's
    /// subject CN is the user. In a cluster the node link then runs TLS too, each node
    /// verifying the other's --tls-cert against this CA (it must name the host its --peers
    /// entry dials).
    #[arg(long, value_name = "FILE")]
    tls_client_ca: Option<PathBuf>,
    /// Serves --management and --metrics over TLS (HTTPS) with --tls-cert and --tls-key.
    #[arg(long, requires = "tls_listen")]
    management_tls: bool,
    /// Address to serve RabbitMQ's management HTTP API on (RabbitMQ's 15672), with
    /// basic auth by the users of --user or --definitions; /metrics too.
    #[arg(long, value_name = "ADDR")]
    management: Option<SocketAddr>,
    /// Shard threads of the broker (default: the machine's parallelism).
    #[arg(long)]
    shards: Option<usize>,
    /// Directory for durable queues: `queue.declare` with `durable` makes a queue that
    /// survives a restart or a crash; its publishes are confirmed once on disk. Without
    /// it every queue is in memory.
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Address to serve Prometheus metrics on, at /metrics (per-queue gauges and
    /// counters, connections, channels, bytes in and out).
    #[arg(long, value_name = "ADDR")]
    metrics: Option<SocketAddr>,
    /// How much to log to stderr: error, warn, info (connections that end in an error,
    /// shutdown) or debug (every connection).
    #[arg(long, value_name = "LEVEL", default_value = "info")]
    log_level: tracing::Level,
    /// The one user, as NAME:PASSWORD: an administrator with every permission on `/`,
    /// from any address. Without it or --definitions: guest:guest, from loopback only (as
    /// RabbitMQ).
    #[arg(long, value_name = "NAME:PASSWORD", conflicts_with = "definitions")]
    user: Option<String>,
    /// A RabbitMQ definitions file (`rabbitmqctl export_definitions`): its users (with
    /// their password hashes), vhosts and permissions. With --data-dir they are kept
    /// there, and the file's users are read only while the data dir has none.
    #[arg(long, value_name = "FILE")]
    definitions: Option<PathBuf>,
    #[command(flatten)]
    limits: resources::Limits,
    /// How long a consumer may hold a delivery unacked before its lease runs out and the
    /// message goes to another consumer (RabbitMQ's `consumer_timeout`), for the queues
    /// whose `x-consumer-timeout` does not say.
    #[arg(long, value_name = "MS", default_value_t = 1_800_000, value_parser = clap::value_parser!(u64).range(1..=604_800_000))]
    consumer_timeout: u64,
    /// Makes this server a node of the cluster of this name (contract §9): every queue is
    /// replicated to the nodes of --peers, and a publish is confirmed once a majority of
    /// them holds it on disk. Needs --data-dir, --node-id, --raft-listen, --peers and
    /// --cluster-secret-file.
    #[arg(long, value_name = "NAME")]
    cluster: Option<String>,
    /// This node's id in the cluster (1 or more).
    #[arg(long, value_name = "N")]
    node_id: Option<u64>,
    /// Where this node serves the node link (Raft and forwarded calls).
    #[arg(long, value_name = "ADDR")]
    raft_listen: Option<String>,
    /// The address the other nodes dial for this one, where it differs from
    /// --raft-listen; it must be this node's --peers entry.
    #[arg(long, value_name = "ADDR")]
    raft_advertise: Option<String>,
    /// Every node of the cluster, this one included, as ID=ADDR (their node links).
    #[arg(long, value_name = "ID=ADDR,...", value_delimiter = ',')]
    peers: Vec<String>,
    /// The file holding the secret the cluster's nodes share (as RabbitMQ's Erlang cookie;
    /// surrounding whitespace is ignored).
    #[arg(long, value_name = "FILE")]
    cluster_secret_file: Option<PathBuf>,
    /// How long a call waits for its shard's leader (default 10 000).
    #[arg(long, value_name = "MS")]
    cluster_call_timeout: Option<u64>,
    /// How long a node waits to hear from a shard's leader before it stands for election
    /// (default 1 000; drawn up to twice that).
    #[arg(long, value_name = "MS")]
    raft_election_timeout_ms: Option<u64>,
}

/// `--listen`: an address, or none.
#[derive(Debug, Clone, Copy)]
struct Listen(Option<SocketAddr>);

fn parse_listen(value: &str) -> Result<Listen, String> {
    if value == "none" {
        return Ok(Listen(None));
    }
    value
        .parse()
        .map(|addr| Listen(Some(addr)))
        .map_err(|e| format!("{e}: an address such as 127.0.0.1:5672, or none"))
}

/// The TLS listener's config from the flags, if it has one; an error names what is
/// missing or what is wrong with which file.
fn tls_of(args: &Args) -> Result<Option<Arc<Tls>>, String> {
    let Some(_) = args.tls_listen else {
        if args.tls_cert.is_some() || args.tls_key.is_some() || args.tls_client_ca.is_some() {
            return Err("--tls-cert, --tls-key and --tls-client-ca need --tls-listen ADDR".into());
        }
        if args.listen.0.is_none() {
            return Err("--listen none leaves no listener: give --tls-listen".into());
        }
        return Ok(None);
    };
    let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) else {
        return Err("--tls-listen needs --tls-cert FILE and --tls-key FILE".into());
    };
    let files = TlsFiles {
        cert: cert.clone(),
        key: key.clone(),
        client_ca: args.tls_client_ca.clone(),
    };
    Tls::new(files).map(|tls| Some(Arc::new(tls)))
}

fn main() -> ExitCode {
    tune_allocator();
    let cli = Cli::parse();
    if let Some(Command::Cluster { action }) = cli.command {
        return match cluster_command(action) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("leasemqd cluster: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let args = cli.args;
    // Logs go to stderr; the ready line stays on stdout, where scripts read it. openraft
    // (a cluster's groups) says at info and warn what a broker's operator does not need:
    // a warning at every heartbeat a peer misses, dozens a second. Its errors only, its
    // warnings too at debug; the node link says once when a peer is unreachable.
    let raft_level = if args.log_level >= tracing::Level::DEBUG {
        tracing::Level::WARN
    } else {
        tracing::Level::ERROR
    };
    let filter = Targets::new()
        .with_default(args.log_level)
        .with_target("openraft", raft_level);
    let log = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_target(false);
    tracing_subscriber::registry().with(log).with(filter).init();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("leasemqd: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<(), String> {
    let tls = tls_of(&args)?;
    let definitions = match &args.definitions {
        Some(path) => Some(read_definitions(path)?),
        None => None,
    };
    let mut settings = Settings {
        access: Arc::new(access_of(&args, definitions.as_ref())?),
        ack_timeout: Duration::from_millis(args.consumer_timeout),
        ..Settings::default()
    };
    // Its callers are runtime workers, whose cores long yields take (`yield_budget`).
    let mut builder = Broker::builder().yield_budget(serve::YIELD_BUDGET);
    if let Some(n) = args.shards {
        builder = builder.shards(n);
    }
    if let Some(dir) = &args.data_dir {
        builder = builder.data_dir(dir);
        settings.durable = true;
    }
    let cluster = cluster_of(&args)?;
    if let Some(cluster) = &cluster {
        builder = builder.cluster(cluster.clone());
        settings.cluster = true;
    }
    let broker = builder
        .build()
        .map_err(|e| format!("cannot start the broker: {e}"))?;
    // A cluster's node keeps no exchanges, bindings or queue arguments of its own: they
    // would not be replicated (contract §9).
    let data_dir = args.data_dir.as_deref().filter(|_| cluster.is_none());
    let vhosts = Arc::new(VHosts::open(&settings, data_dir, &broker)?);
    settings.data_dir = data_dir.map(std::path::Path::to_path_buf);
    let settings = Arc::new(settings);
    if let Some((path, d)) = &definitions {
        let declares = d.queues.len() + d.exchanges.len() + d.bindings.len();
        if cluster.is_some() && declares > 0 {
            tracing::info!(
                "{}: queues, exchanges and bindings skipped: a cluster's node declares none \
                 at start (declare its queues through a client)",
                path.display()
            );
        } else {
            // Before the runtime starts: what a declaration waits for runs at once.
            imports::declare(&broker, &settings, &vhosts, d)
                .map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    let storage = match (&args.data_dir, &args.cluster, args.node_id) {
        (Some(dir), Some(name), Some(id)) => format!(
            "node {id} of cluster {name:?}, replicated queues in {}",
            dir.display()
        ),
        (Some(dir), _, _) => format!("durable queues in {}", dir.display()),
        (None, _, _) => "every queue is in memory (no --data-dir)".to_string(),
    };
    let result = runtime.block_on(serve_until_signal(
        Addresses::of(&args, tls),
        (args.limits.clone(), args.data_dir.clone()),
        broker.clone(),
        settings,
        vhosts,
        storage,
    ));
    broker.shutdown();
    result
}

/// Who may log in: `--user`, or what the data dir keeps, or `--definitions`, or guest.
fn access_of(args: &Args, definitions: Option<&(PathBuf, Definitions)>) -> Result<Access, String> {
    let given = definitions.map(|(path, d)| (path.as_path(), d));
    Access::from_flags(args.user.as_deref(), args.data_dir.as_deref(), given)
}

/// The cluster this server is a node of, from its flags; `None` without --cluster.
fn cluster_of(args: &Args) -> Result<Option<Cluster>, String> {
    let Some(name) = &args.cluster else {
        let given = args.node_id.is_some() || args.raft_listen.is_some() || !args.peers.is_empty();
        if given {
            return Err("--node-id, --raft-listen and --peers need --cluster NAME".into());
        }
        return Ok(None);
    };
    let need = |what: &str| format!("--cluster needs {what}");
    if args.data_dir.is_none() {
        return Err(need("--data-dir"));
    }
    let id = args.node_id.ok_or_else(|| need("--node-id N"))?;
    let listen = args
        .raft_listen
        .clone()
        .ok_or_else(|| need("--raft-listen ADDR"))?;
    let secret_file =
        (args.cluster_secret_file.as_ref()).ok_or_else(|| need("--cluster-secret-file FILE"))?;
    if args.peers.is_empty() {
        return Err(need("--peers ID=ADDR,ID=ADDR,..."));
    }
    let mut cluster = Cluster::new(name.clone(), id)
        .listen(listen)
        .secret(read_secret(secret_file)?);
    if let Some(addr) = &args.raft_advertise {
        cluster = cluster.advertise(addr.clone());
    }
    for peer in &args.peers {
        let parsed = peer
            .split_once('=')
            .and_then(|(id, addr)| Some((id.trim().parse().ok()?, addr.trim())));
        let Some((id, addr)) = parsed.filter(|(_, addr)| !addr.is_empty()) else {
            return Err(format!("--peers: {peer:?} is not ID=ADDR"));
        };
        cluster = cluster.peer(id, addr);
    }
    if let Some(ms) = args.cluster_call_timeout {
        cluster = cluster.call_timeout(Duration::from_millis(ms));
    }
    if let Some(ms) = args.raft_election_timeout_ms {
        cluster = cluster.election_timeout(Duration::from_millis(ms));
    }
    // With a client CA, the node link runs TLS on the AMQP listener's certificate.
    if let (Some(cert), Some(key), Some(ca)) = (&args.tls_cert, &args.tls_key, &args.tls_client_ca)
    {
        cluster = cluster.tls(tls::link_tls(&TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: Some(ca.clone()),
        })?);
    }
    Ok(Some(cluster))
}

/// The cluster secret in `path`, without surrounding whitespace.
fn read_secret(path: &std::path::Path) -> Result<Vec<u8>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let secret = bytes.trim_ascii();
    if secret.is_empty() {
        return Err(format!("{}: the cluster secret is empty", path.display()));
    }
    Ok(secret.to_vec())
}

/// `leasemqd cluster init|status`: one admin call on a node's link.
fn cluster_command(action: ClusterAction) -> Result<(), String> {
    let (node, call, json) = match &action {
        ClusterAction::Init { node } => (node, AdminCall::Init, false),
        ClusterAction::Status { node, json } => (node, AdminCall::Status, *json),
    };
    let secret = read_secret(&node.cluster_secret_file)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    let limit = Duration::from_secs(30);
    let tls = match (&node.tls_cert, &node.tls_key) {
        (Some(cert), Some(key)) => Some(tls::link_tls(&TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: node.tls_client_ca.clone(),
        })?),
        _ => None,
    };
    let answer = runtime
        .block_on(admin_call(&node.raft, &secret, tls.as_ref(), call, limit))
        .map_err(|e| format!("node at {}: {e}", node.raft))?;
    match call {
        AdminCall::Init => println!("the cluster is formed"),
        AdminCall::Status if json => println!("{}", String::from_utf8_lossy(&answer)),
        AdminCall::Status => {
            let status: ClusterStatus = serde_json::from_slice(&answer)
                .map_err(|e| format!("node at {}: a status that does not read: {e}", node.raft))?;
            print!("{status}");
        }
    }
    Ok(())
}

/// Reads the TLS certificate and key again at every SIGHUP (a future to spawn). Only a
/// server with TLS watches SIGHUP: one without keeps the signal's default, which ends it.
fn reload_on_hangup(tls: Arc<Tls>) -> Result<impl std::future::Future<Output = ()>, String> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hangups =
        signal(SignalKind::hangup()).map_err(|e| format!("cannot watch SIGHUP: {e}"))?;
    Ok(async move {
        while hangups.recv().await.is_some() {
            match tls.reload() {
                Ok(()) => tracing::info!("SIGHUP: TLS certificate and key read again"),
                Err(e) => tracing::error!(
                    "SIGHUP: TLS certificate and key not reloaded, the old ones serve on: {e}"
                ),
            }
        }
    })
}

/// How long a shutdown waits for clients to answer `connection.close`.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// Where a server listens.
struct Addresses {
    /// Plain AMQP.
    plain: Option<SocketAddr>,
    /// AMQP over TLS, with its config.
    tls: Option<(SocketAddr, Arc<Tls>)>,
    /// `--metrics`.
    metrics: Option<SocketAddr>,
    /// `--management`.
    management: Option<SocketAddr>,
    /// `--management-tls`: the management API and metrics over TLS.
    management_tls: bool,
}

impl Addresses {
    fn of(args: &Args, tls: Option<Arc<Tls>>) -> Addresses {
        Addresses {
            plain: args.listen.0,
            tls: args.tls_listen.zip(tls),
            metrics: args.metrics,
            management: args.management,
            management_tls: args.management_tls,
        }
    }
}

/// Binds the AMQP listeners of `addresses`; the ready line's words for them, and their
/// protocols and ports as the management API lists them.
async fn bind(
    addresses: &Addresses,
) -> Result<(Listeners, String, Vec<(&'static str, u16)>), String> {
    let mut listeners = Listeners::default();
    let mut words = Vec::new();
    let mut ports = Vec::new();
    let bind = |addr: SocketAddr| async move {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        let local = listener.local_addr().map_err(|e| e.to_string())?;
        Ok::<_, String>((listener, local))
    };
    if let Some(addr) = addresses.plain {
        let (listener, local) = bind(addr).await?;
        listeners.plain = Some(listener);
        words.push(format!("AMQP 0-9-1 on {local}"));
        ports.push(("amqp", local.port()));
    }
    if let Some((addr, tls)) = &addresses.tls {
        let (listener, local) = bind(*addr).await?;
        listeners.tls = Some((listener, Arc::clone(tls)));
        words.push(format!("AMQP 0-9-1 over TLS on {local}"));
        ports.push(("amqp/ssl", local.port()));
    }
    Ok((listeners, words.join(", "), ports))
}

async fn serve_until_signal(
    addresses: Addresses,
    (limits, data_dir): (resources::Limits, Option<PathBuf>),
    broker: Broker,
    settings: Arc<Settings>,
    vhosts: Arc<VHosts>,
    storage: String,
) -> Result<(), String> {
    let (listeners, amqp_line, ports) = bind(&addresses).await?;
    let tls = addresses.tls.as_ref().filter(|_| addresses.management_tls);
    let tls = tls.map(|(_, tls)| Arc::clone(tls));
    let mut metrics_line = match addresses.metrics {
        Some(addr) => {
            let registry = Arc::new(settings.metrics.registry(broker.clone()));
            leasemq_server::metrics::start(addr, registry, tls.clone()).await?
        }
        None => String::new(),
    };
    if let Some(addr) = addresses.management {
        let mut management = Management::new(broker.clone(), settings.clone(), vhosts.clone());
        management.listeners = ports;
        metrics_line += &management::start(addr, tls, management).await?;
    }
    let alarms_line = resources::start(&limits, data_dir.as_deref(), &settings);
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| format!("cannot watch SIGTERM: {e}"))?;
    println!(
        "leasemqd {} ready: {amqp_line}, {} shards; {storage}; {alarms_line}{metrics_line}",
        env!("CARGO_PKG_VERSION"),
        broker.shard_count(),
    );
    if let Some((_, tls)) = addresses.tls {
        tokio::spawn(reload_on_hangup(tls)?);
    }
    tokio::select! {
        () = serve::serve(listeners, broker, settings.clone(), vhosts) => {}
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
        _ = sigterm.recv() => tracing::info!("SIGTERM: shutting down"),
    }
    // Every connection gets connection.close 320 and returns its unacked deliveries;
    // clients have a moment to answer before the broker stops.
    settings.shutdown.send_replace(true);
    let deadline = tokio::time::Instant::now() + SHUTDOWN_GRACE;
    while settings.metrics.connections.get() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}
