//! `leasemqd`: serves a leasemq broker over AMQP 0-9-1 (contract §8).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use leasemq::Broker;
use leasemq_server::exchange::Exchanges;
use leasemq_server::{memory, serve, Settings, VHost};
use mimalloc::MiMalloc;

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
#[command(version)]
struct Args {
    /// Address to listen on (port 0 picks a free port; the ready line names it).
    #[arg(long, default_value = "127.0.0.1:5672")]
    listen: SocketAddr,
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
    /// The user PLAIN accepts, as NAME:PASSWORD. Default guest:guest, from loopback only
    /// (as RabbitMQ); any other user may connect from anywhere.
    #[arg(long, value_name = "NAME:PASSWORD")]
    user: Option<String>,
    /// Memory limit (RabbitMQ's `vm_memory_high_watermark`): while the server's resident
    /// memory is at or over it, connections that publish are blocked (and told so with
    /// `connection.blocked`) and consumers go on. A share of the machine's memory (or of
    /// its cgroup's limit) written with a decimal point, or a size: `512MiB`, `2GB`. `0`
    /// blocks every publish.
    #[arg(long, value_name = "LIMIT", default_value = "0.4", value_parser = memory::parse_watermark)]
    memory_high_watermark: memory::Watermark,
}

fn main() -> ExitCode {
    tune_allocator();
    let args = Args::parse();
    // Logs go to stderr; the ready line stays on stdout, where scripts read it.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(args.log_level)
        .with_target(false)
        .init();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("leasemqd: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<(), String> {
    let mut settings = Settings::default();
    if let Some(user) = &args.user {
        let Some((name, password)) = user.split_once(':').filter(|(n, _)| !n.is_empty()) else {
            return Err(format!("--user {user:?} is not NAME:PASSWORD"));
        };
        settings.loopback_only = false;
        settings.user = name.to_string();
        settings.password = password.to_string();
    }
    // Every caller of the broker here is a task on the runtime's workers: a long run of
    // yields in a wait takes the cores they need (see `BrokerBuilder::yield_budget`).
    let mut builder = Broker::builder().yield_budget(serve::YIELD_BUDGET);
    if let Some(n) = args.shards {
        builder = builder.shards(n);
    }
    if let Some(dir) = &args.data_dir {
        builder = builder.data_dir(dir);
        settings.durable = true;
    }
    let broker = builder
        .build()
        .map_err(|e| format!("cannot start the broker: {e}"))?;
    let mut vhost = VHost::new(&settings);
    if let Some(dir) = &args.data_dir {
        // Bindings are kept for the queues that came back: the durable ones.
        let exchanges = Exchanges::open(dir, |queue| broker.queue(queue).is_some())?;
        vhost.exchanges = Mutex::new(exchanges);
        // And the durable queues as they were declared: dead-letter routes, TTLs, expiry.
        vhost.restore(dir, &broker)?;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    let storage = match &args.data_dir {
        Some(dir) => format!("durable queues in {}", dir.display()),
        None => "every queue is in memory (no --data-dir)".to_string(),
    };
    let memory_limit = args.memory_high_watermark.bytes();
    let result = runtime.block_on(serve_until_signal(
        args.listen,
        args.metrics,
        memory_limit,
        broker.clone(),
        Arc::new(settings),
        Arc::new(vhost),
        storage,
    ));
    broker.shutdown();
    result
}

/// How long a shutdown waits for clients to answer `connection.close`.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

async fn serve_until_signal(
    listen: SocketAddr,
    metrics: Option<SocketAddr>,
    memory_limit: Option<u64>,
    broker: Broker,
    settings: Arc<Settings>,
    vhost: Arc<VHost>,
    storage: String,
) -> Result<(), String> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    let metrics_line = match metrics {
        Some(addr) => {
            let metrics_listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| format!("cannot listen on {addr} for --metrics: {e}"))?;
            let at = metrics_listener.local_addr().map_err(|e| e.to_string())?;
            let registry = Arc::new(settings.metrics.registry(broker.clone()));
            tokio::spawn(leasemq_server::metrics::serve(metrics_listener, registry));
            format!("; metrics on http://{at}/metrics")
        }
        None => String::new(),
    };
    let memory_line = match memory_limit {
        Some(limit) => {
            tokio::spawn(memory::watch(
                settings.memory_alarm.clone(),
                settings.metrics.clone(),
                limit,
            ));
            format!("memory limit {} MiB", limit >> 20)
        }
        None => "no memory limit (the machine's memory cannot be read)".to_string(),
    };
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| format!("cannot watch SIGTERM: {e}"))?;
    println!(
        "leasemqd {} ready: AMQP 0-9-1 on {local}, {} shards; {storage}; {memory_line}{metrics_line}",
        env!("CARGO_PKG_VERSION"),
        broker.shard_count(),
    );
    tokio::select! {
        () = serve::serve(listener, broker, settings.clone(), vhost) => {}
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
