//! Smoke runs of every subcommand (about a second each): they exit 0, write a summary.json
//! that parses, with ordered percentiles and nothing lost, one .hgrm per histogram that ends
//! with HdrHistogram's footer, one .hlog interval log per histogram whose intervals add up
//! to the summary's counts, and a well-formed SVG plot.

use std::collections::HashMap;
use std::fs;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::Mutex;

use base64::Engine as _;
use hdrhistogram::serialization::interval_log::{IntervalLogIterator, LogEntry};
use hdrhistogram::serialization::Deserializer;
use hdrhistogram::Histogram;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_leasemq-loadgen");

/// One run at a time: they measure, and would only slow each other down.
static SERIAL: Mutex<()> = Mutex::new(());

fn run(args: &[&str]) -> Output {
    let _one_at_a_time = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    Command::new(BIN)
        .args(args)
        .output()
        .expect("run leasemq-loadgen")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs a subcommand with `--out` and checks everything it wrote; returns the summary.
fn run_and_check(name: &str, args: &[&str]) -> Value {
    let dir = tempfile::Builder::new()
        .prefix(&format!("leasemq-loadgen-{name}-"))
        .tempdir()
        .expect("create temp dir");
    let out = dir.path().to_str().expect("utf-8 temp path");
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--out", out]);
    let output = run(&all);
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert!(
        output.status.success(),
        "{args:?} exited {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status.code()
    );
    if args.contains(&"--quiet") {
        assert!(stdout.is_empty(), "--quiet printed:\n{stdout}");
    } else {
        assert!(stdout.contains("accounting"), "no table:\n{stdout}");
        assert!(stdout.contains(": OK"), "not OK:\n{stdout}");
    }

    let json = fs::read_to_string(dir.path().join("summary.json")).expect("summary.json written");
    let summary: Value = serde_json::from_str(&json).expect("summary.json parses");
    let accounting = &summary["accounting"];
    assert_eq!(accounting["ok"], Value::Bool(true), "{accounting}");
    assert_eq!(accounting["lost"].as_u64(), Some(0), "{accounting}");
    assert_eq!(accounting["double_acked"].as_u64(), Some(0), "{accounting}");
    let put = accounting["put"].as_u64().expect("put");
    assert!(put > 0, "nothing was put");
    assert_eq!(accounting["acked"].as_u64(), Some(put), "{accounting}");

    // A sweep reports histograms per step, and tags each step's intervals in the .hlog.
    let sets: Vec<(Option<String>, &Value)> = match summary["steps"].as_array() {
        Some(steps) => steps
            .iter()
            .map(|s| {
                (
                    Some(s["tag"].as_str().expect("tag").to_string()),
                    &s["histograms"],
                )
            })
            .collect(),
        None => vec![(None, &summary["histograms"])],
    };
    let mut hlogs: HashMap<String, HashMap<Option<String>, u64>> = HashMap::new();
    for (tag, hists) in sets {
        let hists = hists.as_array().expect("histograms");
        assert!(!hists.is_empty());
        for h in hists {
            let v = |k: &str| h[k].as_u64().unwrap_or_else(|| panic!("{k} in {h}"));
            let ordered = [v("min"), v("p50"), v("p90"), v("p99"), v("p99_9"), v("max")];
            assert!(
                ordered.windows(2).all(|w| w[0] <= w[1]),
                "percentiles out of order: {h}"
            );
            let file = h["hgrm"].as_str().expect("hgrm file named");
            check_hgrm(&dir.path().join(file), v("count"));
            let log = h["hlog"].as_str().expect("hlog file named").to_string();
            let counts = hlogs
                .entry(log.clone())
                .or_insert_with(|| hlog_counts(&dir.path().join(&log)));
            assert_eq!(
                counts.get(&tag).copied().unwrap_or(0),
                v("count"),
                "{log}, tag {tag:?}: the intervals do not add up to the summary's count"
            );
        }
    }
    for plot in summary["plots"].as_array().expect("plots") {
        check_svg(&dir.path().join(plot.as_str().expect("plot file")));
    }
    summary
}

/// Reads an interval log back with HdrHistogram's own parser: the values of every interval,
/// added up by tag. Interval start times never go backwards.
fn hlog_counts(path: &Path) -> HashMap<Option<String>, u64> {
    let bytes = fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut counts = HashMap::new();
    let mut last_start = std::time::Duration::ZERO;
    let mut intervals = 0;
    for entry in IntervalLogIterator::new(&bytes) {
        let LogEntry::Interval(i) = entry.expect("the interval log parses") else {
            continue;
        };
        let encoded = base64::engine::general_purpose::STANDARD
            .decode(i.encoded_histogram())
            .expect("an interval is base64");
        let hist: Histogram<u64> = Deserializer::new()
            .deserialize(&mut &encoded[..])
            .expect("an interval is an HdrHistogram");
        assert!(i.start_timestamp() >= last_start, "{}", path.display());
        last_start = i.start_timestamp();
        *counts
            .entry(i.tag().map(|t| t.as_str().to_string()))
            .or_insert(0) += hist.len();
        intervals += 1;
    }
    assert!(intervals > 0, "{}: no intervals", path.display());
    counts
}

/// An SVG document with at least one line drawn in it.
fn check_svg(path: &Path) {
    let body = fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let head = body.trim_start();
    assert!(
        head.starts_with("<svg") || head.starts_with("<?xml"),
        "{}: not SVG",
        path.display()
    );
    assert!(
        body.trim_end().ends_with("</svg>"),
        "{}: unterminated",
        path.display()
    );
    assert!(
        body.contains("<polyline") || body.contains("<path"),
        "{}: no line drawn",
        path.display()
    );
}

/// The .hgrm ends with the three footer lines and its total count matches.
fn check_hgrm(path: &Path, count: u64) {
    let body = fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let lines: Vec<&str> = body.lines().collect();
    assert!(
        lines[0].trim_start().starts_with("Value"),
        "{}",
        path.display()
    );
    let n = lines.len();
    assert!(n >= 5, "{}: too short", path.display());
    assert!(lines[n - 3].starts_with("#[Mean    = "), "{body}");
    assert!(lines[n - 2].starts_with("#[Max     = "), "{body}");
    assert!(
        lines[n - 2].ends_with(&format!("Total count    = {count:>12}]")),
        "{body}"
    );
    assert!(lines[n - 1].starts_with("#[Buckets = "), "{body}");
    if count > 0 {
        let last: Vec<&str> = lines[n - 4].split_whitespace().collect();
        assert_eq!(last[1], "1.000000000000", "{body}");
        assert_eq!(last[2], count.to_string(), "{body}");
    }
}

/// The summary's entry for rate `name`.
fn rate_entry<'a>(summary: &'a Value, name: &str) -> &'a Value {
    summary["rates"]
        .as_array()
        .expect("rates")
        .iter()
        .find(|r| r["name"] == name)
        .unwrap_or_else(|| panic!("rate {name}"))
}

fn rate(summary: &Value, name: &str) -> f64 {
    rate_entry(summary, name)["per_second"]
        .as_f64()
        .expect("per_second")
}

/// How many `name` counted in the window.
fn rate_total(summary: &Value, name: &str) -> u64 {
    rate_entry(summary, name)["total"].as_u64().expect("total")
}

#[test]
fn throughput_batched_closed_loop() {
    let s = run_and_check(
        "tp-batched",
        &[
            "throughput",
            "--shards",
            "2",
            "--api",
            "batched",
            "--duration",
            "1s",
            "--warmup",
            "200ms",
        ],
    );
    assert!(rate(&s, "acked") > 0.0);
    assert_eq!(s["command"], "throughput");
    let names: Vec<&str> = s["histograms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "put_to_deliver",
            "put_to_ack",
            "settle_rtt",
            "put_to_confirm"
        ]
    );
    // Every message sent in the window has its put answered, and only those.
    assert_eq!(
        histogram_count(&s, "put_to_confirm"),
        Some(rate_total(&s, "put"))
    );
}

/// `--background-load` runs its busy threads for the run, says so, and leaves none behind.
#[test]
fn throughput_beside_a_background_load() {
    let s = run_and_check(
        "tp-background",
        &[
            "throughput",
            "--api",
            "per-message",
            "--duration",
            "500ms",
            "--warmup",
            "100ms",
            "--background-load",
            "2",
        ],
    );
    assert!(rate(&s, "acked") > 0.0);
    assert_eq!(s["config"]["background_load"], 2);
    let title = s["title"].as_str().unwrap();
    assert!(title.contains("beside 2 CPU-bound"), "{title}");
    // The broker's default slice for its shards; the workers keep the system's.
    assert!(
        title.contains("time slice: shards 100 µs, workers system"),
        "{title}"
    );
    assert_eq!(s["config"]["shard_time_slice_us"], 100);
    assert!(s["config"]["caller_time_slice_us"].is_null());
    let left: Vec<_> = fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| fs::read(e.path().join("cmdline")).ok())
        .filter(|cmd| String::from_utf8_lossy(cmd).contains("__background-load"))
        .collect();
    assert!(left.is_empty(), "background load still running: {left:?}");
}

/// `--shard-time-slice` and `--caller-time-slice` are recorded in the title and the config.
#[test]
fn throughput_with_chosen_time_slices() {
    let s = run_and_check(
        "tp-slices",
        &[
            "throughput",
            "--api",
            "per-message",
            "--duration",
            "300ms",
            "--warmup",
            "100ms",
            "--shard-time-slice",
            "system",
            "--caller-time-slice",
            "200us",
        ],
    );
    assert!(rate(&s, "acked") > 0.0);
    let title = s["title"].as_str().unwrap();
    assert!(
        title.contains("time slice: shards system, workers 200 µs"),
        "{title}"
    );
    assert!(s["config"]["shard_time_slice_us"].is_null());
    assert_eq!(s["config"]["caller_time_slice_us"], 200);
}

/// `--yield-budget` is recorded in the title and the config of the run it chose it for;
/// the default is recorded in the config only.
#[test]
fn throughput_with_a_chosen_yield_budget() {
    let s = run_and_check(
        "tp-yield",
        &[
            "throughput",
            "--api",
            "async",
            "--duration",
            "300ms",
            "--warmup",
            "100ms",
            "--yield-budget",
            "20us",
        ],
    );
    assert!(rate(&s, "acked") > 0.0);
    let title = s["title"].as_str().unwrap();
    assert!(title.contains("; yield budget 20 µs"), "{title}");
    assert_eq!(s["config"]["yield_budget_us"], 20);
    let s = run_and_check(
        "tp-yield-default",
        &["throughput", "--duration", "300ms", "--warmup", "100ms"],
    );
    assert!(!s["title"].as_str().unwrap().contains("yield budget"));
    assert_eq!(s["config"]["yield_budget_us"], 500);
}

/// `--durable` declares durable queues on a broker with a temporary data dir, says so in
/// the title and the config, and removes the data dir at the end.
#[test]
fn throughput_durable_in_a_temporary_data_dir() {
    let s = run_and_check(
        "tp-durable",
        &[
            "throughput",
            "--durable",
            "--duration",
            "300ms",
            "--warmup",
            "100ms",
        ],
    );
    assert!(rate(&s, "acked") > 0.0);
    let config = &s["config"];
    assert_eq!(config["durable"], true, "{config}");
    assert_eq!(config["sync"], "always", "{config}");
    assert_eq!(config["data_dir"]["temporary"], true, "{config}");
    let title = s["title"].as_str().unwrap();
    assert!(title.contains("durable queues (sync always)"), "{title}");
    assert_eq!(
        histogram_count(&s, "put_to_confirm"),
        Some(rate_total(&s, "put"))
    );
    let dir = config["data_dir"]["path"].as_str().expect("data dir path");
    assert!(!Path::new(dir).exists(), "{dir} outlived the run");
}

/// In-memory runs say so: not durable, no data dir.
#[test]
fn throughput_in_memory_reports_no_data_dir() {
    let s = run_and_check(
        "tp-memory",
        &[
            "throughput",
            "--duration",
            "200ms",
            "--warmup",
            "50ms",
            "--quiet",
        ],
    );
    assert_eq!(s["config"]["durable"], false);
    assert_eq!(s["config"]["sync"], Value::Null);
    assert_eq!(s["config"]["data_dir"], Value::Null);
}

/// Each step of a durable sweep starts on an empty data dir of its own inside the one given
/// (a second shard count would not open the first's), and the given one is left in place.
#[test]
fn sweep_durable_in_a_given_data_dir() {
    let data = tempfile::tempdir().expect("create temp dir");
    let path = data.path().to_str().expect("utf-8 temp path");
    let s = run_and_check(
        "sweep-durable",
        &[
            "sweep",
            "--durable",
            "--data-dir",
            path,
            "--sync",
            "interval:5",
            "--shards",
            "1,2",
            "--start-rate",
            "5k",
            "--max-steps",
            "1",
            "--step-duration",
            "300ms",
            "--step-warmup",
            "100ms",
            "--slo",
            "p99=1s",
            "--slo-on",
            "put_to_confirm",
            "--max-shortfall",
            "0.5",
            "--quiet",
        ],
    );
    assert_eq!(s["steps"].as_array().expect("steps").len(), 2);
    let config = &s["config"];
    assert_eq!(config["durable"], true, "{config}");
    // `--slo-on put_to_confirm` judges each step on the put's answer, not on put→ack.
    assert_eq!(config["slo_on"], "put_to_confirm", "{config}");
    let title = s["title"].as_str().unwrap();
    assert!(title.contains("SLO on put→answered"), "{title}");
    for step in s["steps"].as_array().unwrap() {
        let confirm_p99 = step["histograms"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h["name"] == "put_to_confirm")
            .and_then(|h| h["p99"].as_u64())
            .unwrap_or_else(|| panic!("put_to_confirm in {step}"));
        assert_eq!(step["slos"][0]["value_ns"], confirm_p99, "{step}");
    }
    assert_eq!(config["sync"], "interval:5ms", "{config}");
    assert_eq!(config["data_dir"]["path"], path, "{config}");
    assert_eq!(config["data_dir"]["temporary"], false, "{config}");
    assert!(data.path().exists());
    let left: Vec<_> = fs::read_dir(data.path()).unwrap().collect();
    assert!(left.is_empty(), "step data dirs left behind: {left:?}");
}

#[test]
fn throughput_per_message_open_loop() {
    let s = run_and_check(
        "tp-open",
        &[
            "throughput",
            "--producers",
            "2",
            "--consumers",
            "2",
            "--queues",
            "2",
            "--api",
            "per-message",
            "--rate",
            "20k",
            "--duration",
            "700ms",
            "--warmup",
            "100ms",
            "--quiet",
        ],
    );
    // An open loop puts what it was asked to, give or take a message per producer.
    let put = rate(&s, "put");
    assert!((19_000.0..=21_000.0).contains(&put), "put {put}/s");
}

/// The summary's "settle calls".
fn settle_calls(summary: &Value) -> u64 {
    summary["details"]
        .as_array()
        .expect("details")
        .iter()
        .find(|d| d["name"] == "settle calls")
        .and_then(|d| d["value"].as_u64())
        .expect("settle calls")
}

#[test]
fn throughput_async_tasks() {
    let s = run_and_check(
        "tp-async",
        &[
            "throughput",
            "--producers",
            "8",
            "--consumers",
            "8",
            "--queues",
            "2",
            "--api",
            "async",
            "--runtime-threads",
            "2",
            "--duration",
            "700ms",
            "--warmup",
            "100ms",
            "--quiet",
        ],
    );
    assert!(rate(&s, "acked") > 0.0);
    assert_eq!(s["config"]["api"], "async");
    assert_eq!(s["config"]["runtime_threads"], 2);
    // One `ack_async` per message, as with the blocking per-message API.
    assert_eq!(Some(settle_calls(&s)), s["accounting"]["acked"].as_u64());
}

/// Per-message calls on durable queues, several in flight per task: nothing is lost or
/// acked twice, and every message still gets an ack of its own.
#[test]
fn throughput_async_tasks_keep_calls_in_flight_on_durable_queues() {
    let s = run_and_check(
        "tp-async-pipeline",
        &[
            "throughput",
            "--producers",
            "4",
            "--consumers",
            "4",
            "--queues",
            "2",
            "--api",
            "async",
            "--pipeline",
            "16",
            "--durable",
            "--duration",
            "700ms",
            "--warmup",
            "100ms",
            "--quiet",
        ],
    );
    assert!(rate(&s, "acked") > 0.0);
    assert_eq!(s["config"]["pipeline"], 16);
    assert_eq!(Some(settle_calls(&s)), s["accounting"]["acked"].as_u64());
    assert_eq!(
        histogram_count(&s, "put_to_confirm"),
        Some(rate_total(&s, "put"))
    );
}

#[test]
fn redelivery_measures_lateness() {
    let s = run_and_check(
        "redelivery",
        &[
            "redelivery",
            "--leases",
            "5000",
            "--ack-timeout",
            "200ms",
            "--never-ack-fraction",
            "0.05",
            "--duration",
            "1s",
        ],
    );
    let lateness = &s["histograms"][0];
    assert_eq!(lateness["name"], "lateness");
    assert!(lateness["count"].as_u64().unwrap() > 0, "{lateness}");
    assert!(s["accounting"]["expired"].as_u64().unwrap() > 0);
}

#[test]
fn fill_reports_memory_per_queued_message_and_drains_everything() {
    let s = run_and_check(
        "fill",
        &["fill", "--messages", "200k", "--consumers", "2", "--quiet"],
    );
    assert_eq!(s["accounting"]["put"].as_u64(), Some(200_000));
    let bytes = s["process"]["bytes_per_queued_message"]
        .as_f64()
        .expect("bytes per queued message");
    // At least the 16-byte body; a few hundred at most (the bar is 150 at 10 M).
    assert!(
        (16.0..1_000.0).contains(&bytes),
        "{bytes} bytes per message"
    );
    assert!(rate(&s, "acked (draining)") > 0.0);
}

#[test]
fn bad_flags_exit_non_zero_with_a_message() {
    let output = run(&["throughput", "--queues", "3", "--consumers", "1"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(text(&output.stderr).contains("every queue needs a consumer"));
    let output = run(&["throughput", "--duration", "5"]);
    assert!(!output.status.success());
    assert!(text(&output.stderr).contains("no unit"));
    let output = run(&["throughput", "--api", "async", "--rate", "1000"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(text(&output.stderr).contains("closed loop only"));
    let output = run(&["throughput", "--pipeline", "4"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(text(&output.stderr).contains("needs --api async"));
    let output = run(&["throughput", "--sync", "interval:10"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(text(&output.stderr).contains("needs --durable or --data-dir"));
    let output = run(&["throughput", "--durable", "--sync", "sometimes"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(text(&output.stderr).contains("interval:MS"));
    for slice in ["50us", "1s", "often"] {
        let output = run(&["throughput", "--caller-time-slice", slice]);
        assert_eq!(output.status.code(), Some(2), "{slice}");
        assert!(
            text(&output.stderr).contains("--caller-time-slice"),
            "{slice}"
        );
    }
    let output = run(&["throughput", "--confirms"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(text(&output.stderr).contains("needs --target"));
    let output = run(&["throughput", "--client", "raw"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(text(&output.stderr).contains("--client applies to an AMQP run: it needs --target"));
    let output = run(&[
        "throughput",
        "--target",
        "amqp://127.0.0.1:1/%2f",
        "--client",
        "x",
    ]);
    assert_eq!(output.status.code(), Some(2));
    assert!(text(&output.stderr).contains("lapin, raw"));
    // Nothing listens on port 1: the run says so rather than hang.
    let output = run(&[
        "throughput",
        "--target",
        "amqp://guest:guest@127.0.0.1:1/%2f",
    ]);
    assert_eq!(output.status.code(), Some(2));
    assert!(text(&output.stderr).contains("connecting to"));
    let output = run(&[
        "throughput",
        "--target",
        "amqp://guest:guest@127.0.0.1:1/%2f",
        "--client",
        "raw",
    ]);
    assert_eq!(output.status.code(), Some(2));
    assert!(text(&output.stderr).contains("connecting to"));
}

#[test]
fn bad_queue_args_exit_non_zero_with_a_message() {
    let output = run(&["throughput", "--queue-arg", "x-queue-type=quorum"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(text(&output.stderr).contains("--queue-arg applies to an AMQP run: it needs --target"));
    let uri = "amqp://guest:guest@127.0.0.1:1/%2f";
    for (bad, says) in [
        ("x-queue-type", "KEY=VALUE"),
        ("=quorum", "key before `=` is empty"),
    ] {
        let output = run(&["throughput", "--target", uri, "--queue-arg", bad]);
        assert_eq!(output.status.code(), Some(2), "{bad}");
        assert!(
            text(&output.stderr).contains(says),
            "{bad}: {}",
            text(&output.stderr)
        );
    }
    let output = run(&[
        "throughput",
        "--target",
        uri,
        "--queue-arg",
        "x-queue-type=quorum",
    ]);
    assert_eq!(output.status.code(), Some(2));
    assert!(text(&output.stderr).contains("add --durable"));
}

/// leasemqd served in-process on a loopback port, for `throughput --target`; it stops
/// when the value is dropped.
struct Leasemqd {
    _runtime: tokio::runtime::Runtime,
    broker: leasemq::Broker,
    uri: String,
    addr: std::net::SocketAddr,
}

impl Leasemqd {
    fn start() -> Leasemqd {
        Leasemqd::start_with(leasemq_server::Settings::default())
    }

    fn start_with(settings: leasemq_server::Settings) -> Leasemqd {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let broker = leasemq::Broker::builder().shards(1).build().unwrap();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let settings = std::sync::Arc::new(settings);
        runtime.spawn(leasemq_server::serve::accept_loop(
            listener,
            broker.clone(),
            settings,
        ));
        Leasemqd {
            _runtime: runtime,
            broker,
            uri: format!("amqp://guest:guest@{addr}/%2f"),
            addr,
        }
    }
}

/// leasemqd served over TLS only, with a certificate for localhost that a CA of the
/// test's own signed; `ca` is that CA's PEM file.
struct TlsLeasemqd {
    server: Leasemqd,
    ca: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl TlsLeasemqd {
    fn start() -> TlsLeasemqd {
        use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
        let dir = tempfile::tempdir().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec!["localhost".to_string()])
            .unwrap()
            .signed_by(&key, &ca)
            .unwrap();
        let path = |name: &str| dir.path().join(name);
        fs::write(path("ca.pem"), ca.pem()).unwrap();
        fs::write(path("server.pem"), cert.pem()).unwrap();
        fs::write(path("server.key"), key.serialize_pem()).unwrap();
        let tls = leasemq_server::tls::Tls::new(leasemq_server::tls::TlsFiles {
            cert: path("server.pem"),
            key: path("server.key"),
            client_ca: None,
        })
        .unwrap();

        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let broker = leasemq::Broker::builder().shards(1).build().unwrap();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let settings = std::sync::Arc::new(leasemq_server::Settings::default());
        let vhost = std::sync::Arc::new(leasemq_server::VHost::new(&settings));
        let vhosts = leasemq_server::vhost::VHosts::one(vhost);
        let listeners = leasemq_server::serve::Listeners {
            plain: None,
            tls: Some((listener, std::sync::Arc::new(tls))),
        };
        runtime.spawn(leasemq_server::serve::serve(
            listeners,
            broker.clone(),
            settings,
            vhosts,
        ));
        TlsLeasemqd {
            server: Leasemqd {
                _runtime: runtime,
                broker,
                uri: format!("amqps://guest:guest@localhost:{}/%2f", addr.port()),
                addr,
            },
            ca: path("ca.pem"),
            _dir: dir,
        }
    }
}

impl Drop for Leasemqd {
    fn drop(&mut self) {
        self.broker.shutdown();
    }
}

fn histogram_count(summary: &Value, name: &str) -> Option<u64> {
    summary["histograms"]
        .as_array()
        .expect("histograms")
        .iter()
        .find(|h| h["name"] == name)
        .map(|h| h["count"].as_u64().expect("count"))
}

#[test]
fn throughput_over_amqp_acking_each() {
    let server = Leasemqd::start();
    let s = run_and_check(
        "amqp-each",
        &[
            "throughput",
            "--target",
            &server.uri,
            "--duration",
            "1s",
            "--warmup",
            "200ms",
            "--prefetch",
            "100",
            "--body-bytes",
            "32",
        ],
    );
    assert_eq!(
        s["config"]["target"],
        "amqp://guest:***@".to_string() + &server.uri[19..]
    );
    assert_eq!(
        (&s["config"]["ack"], &s["config"]["confirms"]),
        (&"each".into(), &false.into())
    );
    assert!(s["title"]
        .as_str()
        .unwrap()
        .starts_with("AMQP amqp://guest:***@"));
    assert!(rate(&s, "delivered") > 0.0 && rate(&s, "acked") > 0.0);
    assert!(histogram_count(&s, "put_to_deliver").unwrap() > 0);
    assert!(histogram_count(&s, "put_to_ack").unwrap() > 0);
    assert_eq!(histogram_count(&s, "put_to_confirm"), None);
    assert_eq!(s["accounting"]["redelivered"].as_u64(), Some(0));
}

#[test]
fn throughput_over_amqp_with_confirms_and_multiple_acks() {
    let server = Leasemqd::start();
    let s = run_and_check(
        "amqp-multiple",
        &[
            "throughput",
            "--target",
            &server.uri,
            "--duration",
            "1s",
            "--warmup",
            "200ms",
            "--confirms",
            "--ack",
            "multiple:32",
            "--producers",
            "2",
            "--consumers",
            "2",
            "--queues",
            "2",
        ],
    );
    assert_eq!(s["config"]["ack"], "multiple:32");
    assert!(histogram_count(&s, "put_to_confirm").unwrap() > 0);
    let per_call = per_settle_call(&s);
    assert!(per_call > 1.0, "{per_call} messages per basic.ack");
}

#[test]
fn throughput_over_amqp_without_acks() {
    let server = Leasemqd::start();
    let s = run_and_check(
        "amqp-no-ack",
        &[
            "throughput",
            "--target",
            &server.uri,
            "--duration",
            "1s",
            "--warmup",
            "200ms",
            "--no-ack",
            "--body-bytes",
            "16",
        ],
    );
    assert_eq!(s["config"]["ack"], "no-ack");
    assert!(histogram_count(&s, "put_to_deliver").unwrap() > 0);
    assert_eq!(histogram_count(&s, "put_to_ack"), None);
    assert!(rate(&s, "acked") > 0.0);
}

/// The summary's "messages per settle call".
fn per_settle_call(summary: &Value) -> f64 {
    summary["details"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "messages per settle call")
        .and_then(|d| d["value"].as_f64())
        .unwrap()
}

#[test]
fn throughput_over_amqps_with_either_client() {
    let tls = TlsLeasemqd::start();
    let ca = tls.ca.to_str().unwrap();
    for client in ["lapin", "raw"] {
        let s = run_and_check(
            &format!("amqps-{client}"),
            &[
                "throughput",
                "--target",
                &tls.server.uri,
                "--tls-ca",
                ca,
                "--client",
                client,
                "--duration",
                "1s",
                "--warmup",
                "200ms",
                "--prefetch",
                "100",
                "--body-bytes",
                "4096",
            ],
        );
        assert!(rate(&s, "acked") > 0.0, "{client}");
        assert_eq!(s["accounting"]["redelivered"].as_u64(), Some(0));
    }
    // An amqps:// target without the CA to trust is refused before anything runs.
    let output = run(&[
        "throughput",
        "--target",
        &tls.server.uri,
        "--duration",
        "1s",
    ]);
    assert!(!output.status.success());
    assert!(
        text(&output.stderr).contains("--tls-ca"),
        "{}",
        text(&output.stderr)
    );
}

#[test]
fn throughput_over_amqp_raw_acking_each() {
    let server = Leasemqd::start();
    let s = run_and_check(
        "amqp-raw-each",
        &[
            "throughput",
            "--target",
            &server.uri,
            "--client",
            "raw",
            "--duration",
            "1s",
            "--warmup",
            "200ms",
            "--prefetch",
            "100",
            "--body-bytes",
            "32",
        ],
    );
    assert_eq!(
        (&s["config"]["client"], &s["config"]["ack"]),
        (&"raw".into(), &"each".into())
    );
    assert!(s["title"].as_str().unwrap().contains("(raw client)"));
    assert!(rate(&s, "delivered") > 0.0 && rate(&s, "acked") > 0.0);
    assert!(histogram_count(&s, "put_to_deliver").unwrap() > 0);
    assert!(histogram_count(&s, "put_to_ack").unwrap() > 0);
    assert_eq!(histogram_count(&s, "put_to_confirm"), None);
    // One basic.ack per delivery, however many one write carries.
    assert_eq!(per_settle_call(&s), 1.0);
    assert_eq!(s["accounting"]["redelivered"].as_u64(), Some(0));
}

#[test]
fn throughput_over_amqp_raw_with_confirms_and_multiple_acks() {
    // A small frame_max: each 20 000-byte body travels in three body frames.
    let server = Leasemqd::start_with(leasemq_server::Settings {
        frame_max: 8192,
        ..leasemq_server::Settings::default()
    });
    let s = run_and_check(
        "amqp-raw-multiple",
        &[
            "throughput",
            "--target",
            &server.uri,
            "--client",
            "raw",
            "--duration",
            "1s",
            "--warmup",
            "200ms",
            "--confirms",
            "--ack",
            "multiple:32",
            "--producers",
            "2",
            "--consumers",
            "2",
            "--queues",
            "2",
            "--body-bytes",
            "20000",
        ],
    );
    assert_eq!(s["config"]["ack"], "multiple:32");
    assert!(histogram_count(&s, "put_to_confirm").unwrap() > 0);
    let per_call = per_settle_call(&s);
    assert!(per_call > 1.0, "{per_call} messages per basic.ack");
}

#[test]
fn throughput_over_amqp_raw_without_acks() {
    let server = Leasemqd::start();
    let s = run_and_check(
        "amqp-raw-no-ack",
        &[
            "throughput",
            "--target",
            &server.uri,
            "--client",
            "raw",
            "--duration",
            "1s",
            "--warmup",
            "200ms",
            "--no-ack",
            "--body-bytes",
            "16",
        ],
    );
    assert_eq!(s["config"]["ack"], "no-ack");
    assert!(histogram_count(&s, "put_to_deliver").unwrap() > 0);
    assert_eq!(histogram_count(&s, "put_to_ack"), None);
    assert!(rate(&s, "acked") > 0.0);
}

#[test]
fn a_raw_run_the_server_refuses_ends_with_its_reason() {
    // Bodies over the server's limit: it closes the channel at the first publish. The run
    // must end at once and say why, not wait for deliveries that never come.
    let server = Leasemqd::start_with(leasemq_server::Settings {
        max_message_bytes: 1000,
        ..leasemq_server::Settings::default()
    });
    let output = run(&[
        "throughput",
        "--target",
        &server.uri,
        "--client",
        "raw",
        "--duration",
        "1s",
        "--warmup",
        "0s",
        "--body-bytes",
        "2000",
    ]);
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert_eq!(output.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("the server closed the"),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
}

#[test]
fn sweep_two_small_steps() {
    let s = run_and_check(
        "sweep",
        &[
            "sweep",
            "--shards",
            "1,2",
            "--start-rate",
            "5k",
            "--max-steps",
            "1",
            "--step-duration",
            "300ms",
            "--step-warmup",
            "100ms",
            "--slo",
            "p99=1s",
            "--slo",
            "p99.9=2s",
            "--max-shortfall",
            "0.5",
        ],
    );
    assert_eq!(s["command"], "sweep");
    let steps = s["steps"].as_array().expect("steps");
    assert_eq!(steps.len(), 2, "one step per shard count");
    for (step, shards) in steps.iter().zip([1, 2]) {
        assert_eq!(step["shards"], shards);
        assert_eq!(step["offered_rate"], 5000);
        assert_eq!(step["held"], true, "{step}");
        assert_eq!(step["slos"].as_array().unwrap().len(), 2);
        let achieved = step["achieved_rate"].as_f64().unwrap();
        assert!(achieved > 2500.0, "{step}");
    }
    let found = s["max_sustainable"].as_array().expect("max_sustainable");
    assert_eq!(found.len(), 2);
    for m in found {
        assert_eq!(m["max_sustainable_rate"], 5000, "{m}");
        assert_eq!(m["first_broken_rate"], Value::Null, "{m}");
    }
}

#[test]
fn sweep_stops_at_the_first_step_that_breaks() {
    let s = run_and_check(
        "sweep-break",
        &[
            "sweep",
            "--shards",
            "1",
            "--start-rate",
            "5k",
            "--step-duration",
            "200ms",
            "--step-warmup",
            "50ms",
            "--slo",
            "p99=1us",
            "--quiet",
        ],
    );
    let steps = s["steps"].as_array().expect("steps");
    assert_eq!(
        steps.len(),
        1,
        "a break at the first step leaves nothing to bisect"
    );
    assert_eq!(steps[0]["held"], false);
    assert!(steps[0]["broke"][0].as_str().unwrap().starts_with("p99 "));
    assert_eq!(s["max_sustainable"][0]["max_sustainable_rate"], Value::Null);
    assert_eq!(s["max_sustainable"][0]["first_broken_rate"], 5000);
}

/// A second loopback port in front of a server, as another node of a cluster would be:
/// it forwards every connection to the server and counts them.
struct Forwarder {
    _runtime: tokio::runtime::Runtime,
    uri: String,
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Forwarder {
    fn start(to: std::net::SocketAddr) -> Forwarder {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = accepted.clone();
        runtime.spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(async move {
                    if let Ok(mut server) = tokio::net::TcpStream::connect(to).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
            }
        });
        Forwarder {
            _runtime: runtime,
            uri: format!("amqp://guest:guest@{addr}/%2f"),
            accepted,
        }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[test]
fn throughput_over_amqp_spread_over_two_targets_with_queue_args() {
    for client in ["lapin", "raw"] {
        let server = Leasemqd::start();
        let second = Forwarder::start(server.addr);
        let s = run_and_check(
            &format!("amqp-{client}-two-targets"),
            &[
                "throughput",
                "--target",
                &server.uri,
                "--target",
                &second.uri,
                "--client",
                client,
                "--duration",
                "1s",
                "--warmup",
                "200ms",
                "--producers",
                "3",
                "--consumers",
                "3",
                "--queues",
                "3",
                "--queue-arg",
                "x-queue-type=classic",
                "--queue-arg",
                "x-max-length=1000000",
                "--queue-arg",
                "x-single-active-consumer=false",
            ],
        );
        // Connections 0..6 (three consumers, then three producers) alternate between the
        // targets: the second takes consumer 1 and producers 0 and 2; the setup connection
        // goes to the first.
        assert_eq!(second.accepted(), 3, "{client}");
        let masked = |uri: &str| uri.replace("guest:guest@", "guest:***@");
        let (first, other) = (masked(&server.uri), masked(&second.uri));
        assert_eq!(s["config"]["target"], first.as_str());
        assert_eq!(s["config"]["targets"], serde_json::json!([first, other]));
        assert_eq!(
            s["config"]["queue_args"],
            serde_json::json!({
                "x-queue-type": "classic",
                "x-max-length": 1_000_000,
                "x-single-active-consumer": false,
            })
        );
        let title = s["title"].as_str().unwrap();
        assert!(
            title.starts_with(&format!("AMQP {first}, {other} ({client} client)")),
            "{title}"
        );
        assert!(title.contains("3 queue(s) with x-queue-type=classic, x-max-length=1000000, x-single-active-consumer=false;"), "{title}");
        assert!(rate(&s, "acked") > 0.0, "{client}");
    }
}

#[test]
fn each_connection_goes_to_its_target_in_turn() {
    // The second target refuses connections: consumer 0 connects to the first, consumer 1
    // to the second, and the run stops there, naming it.
    let server = Leasemqd::start();
    for client in ["lapin", "raw"] {
        let output = run(&[
            "throughput",
            "--target",
            &server.uri,
            "--target",
            "amqp://guest:guest@127.0.0.1:1/%2f",
            "--client",
            client,
            "--consumers",
            "2",
        ]);
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{client}: {stderr}");
        assert!(
            stderr.contains("consumer: connecting to amqp://guest:***@127.0.0.1:1/%2f"),
            "{client}: {stderr}"
        );
    }
}

#[test]
fn queue_args_reach_the_server() {
    // leasemqd checks x-max-length as RabbitMQ does: a string is refused at the declare.
    let server = Leasemqd::start();
    let output = run(&[
        "throughput",
        "--target",
        &server.uri,
        "--queue-arg",
        "x-max-length=many",
    ]);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("declaring a queue"), "{stderr}");
    assert!(stderr.contains("x-max-length"), "{stderr}");
}
