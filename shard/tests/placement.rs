//! Queue placement is fixed for good: `placement.golden` holds the shard of a thousand and
//! more names for several shard counts, as XXH3-64 placed them when the file was written.
//! A change here moves queues between shards of every existing data directory, so this
//! test failing means a migration, not a file to refresh.
//!
//! To write the file anew (only for names or shard counts added, never for a changed
//! mapping): `LEASEMQ_WRITE_PLACEMENT=1 cargo test -p leasemq-shard --test placement`.

use std::fmt::Write as _;
use std::path::PathBuf;

use leasemq_shard::shard_for;

const SHARD_COUNTS: [usize; 9] = [1, 2, 3, 4, 7, 8, 16, 64, 1024];

fn names() -> Vec<String> {
    let mut names: Vec<String> = (0..1000).map(|i| format!("queue-{i}")).collect();
    names.extend(
        [
            "a",
            "jobs",
            "emails",
            "emails.dead",
            "orders.v2.retry",
            "ünïcödé-queue",
            "队列",
            "~0-1",
            " spaced name ",
        ]
        .map(String::from),
    );
    names.push("x".repeat(255));
    names
}

fn table() -> String {
    let mut out = String::from("# name\tshard for each count in");
    for n in SHARD_COUNTS {
        write!(out, " {n}").unwrap();
    }
    out.push('\n');
    for name in names() {
        out.push_str(&name.escape_default().to_string());
        out.push('\t');
        let shards: Vec<String> = SHARD_COUNTS
            .iter()
            .map(|&n| shard_for(&name, n).to_string())
            .collect();
        out.push_str(&shards.join(" "));
        out.push('\n');
    }
    out
}

#[test]
fn placement_matches_the_golden_file() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/placement.golden");
    let now = table();
    if std::env::var_os("LEASEMQ_WRITE_PLACEMENT").is_some() {
        std::fs::write(&path, &now).expect("write the golden file");
    }
    let golden = std::fs::read_to_string(&path).expect("tests/placement.golden");
    for (line, (want, got)) in golden.lines().zip(now.lines()).enumerate() {
        assert_eq!(
            got,
            want,
            "placement changed at line {} of placement.golden",
            line + 1
        );
    }
    assert_eq!(golden.lines().count(), now.lines().count());
}
