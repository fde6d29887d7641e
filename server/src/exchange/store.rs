//! The exchanges' file in a data dir: the durable exchanges and their bindings to durable
//! queues, written whole before a change is answered, and read back after a restart.

use std::fs;
use std::io::{self, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{Bindings, Exchanges, Kind, Refusal, Shape, FILE};

/// What [`FILE`] holds: the durable exchanges, each with its bindings.
#[derive(Debug, Serialize, Deserialize)]
struct Stored {
    version: u32,
    exchanges: Vec<StoredExchange>,
}

#[derive(Debug, Serialize, Deserialize)]
struct StoredExchange {
    name: String,
    /// Absent for a direct exchange, as in files written before other types were served.
    #[serde(default, skip_serializing_if = "Kind::is_direct")]
    kind: Kind,
    /// Absent in files written before auto-delete exchanges were served.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    auto_delete: bool,
    /// Absent unless internal, as in files written before internal exchanges were served.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    internal: bool,
    /// Absent where there is none, as in files written before alternates were served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    alternate_exchange: Option<String>,
    /// (routing key, queue) pairs.
    bindings: Vec<(String, String)>,
    /// (routing key, destination exchange) pairs; absent where there are none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    exchange_bindings: Vec<(String, String)>,
}

/// The version of [`Stored`] written where every exchange kept is direct and not
/// auto-delete: what builds that served only those read.
const VERSION_DIRECT: u32 = 1;
/// The version written where one is not, but every exchange routes to queues only and is
/// neither internal nor has an alternate: a build that reads only version 1 refuses the
/// file, rather than route a fanout or topic exchange as a direct one.
const VERSION_TYPED: u32 = 2;
/// The version written where an exchange is bound to another, is internal or has an
/// alternate: a build that reads at most version 2 refuses the file, rather than drop
/// what those route.
const VERSION: u32 = 3;

/// Replaces `file` with `bytes` so that a crash leaves the old contents or the new, never
/// a mix: a temporary file, fsynced, renamed over it, and the directory fsynced. An error
/// says whether the rename was done (only the directory's fsync failed).
pub(crate) fn write_atomically(file: &Path, bytes: &[u8]) -> Result<(), (io::Error, bool)> {
    let dir = file.parent().unwrap_or(Path::new("."));
    let temporary = file.with_extension("json.tmp");
    let before_rename = |e| (e, false);
    let mut out = fs::File::create(&temporary).map_err(before_rename)?;
    out.write_all(bytes).map_err(before_rename)?;
    out.sync_all().map_err(before_rename)?;
    drop(out);
    fs::rename(&temporary, file).map_err(before_rename)?;
    (fs::File::open(dir).and_then(|d| d.sync_all())).map_err(|e| (e, true))
}

impl Exchanges {
    /// The exchanges kept in `dir` (none yet if it has no [`FILE`]), which keeps every
    /// later change to a durable one; a binding is kept if `queue_exists` says its queue
    /// came back (a binding to an exchange: if that exchange is in the file).
    ///
    /// # Errors
    ///
    /// A file that cannot be read or parsed, named in the message: the server must not
    /// start and route differently than before.
    pub fn open(dir: &Path, queue_exists: impl Fn(&str) -> bool) -> Result<Exchanges, String> {
        let file = dir.join(FILE);
        let mut exchanges = Exchanges {
            file: Some(file.clone()),
            ..Exchanges::default()
        };
        let text = match fs::read_to_string(&file) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(exchanges),
            Err(e) => return Err(format!("cannot read {}: {e}", file.display())),
        };
        let stored: Stored = serde_json::from_str(&text)
            .map_err(|e| format!("{} is damaged: {e}", file.display()))?;
        if !(VERSION_DIRECT..=VERSION).contains(&stored.version) {
            return Err(format!(
                "{} has version {}; this leasemqd reads versions {VERSION_DIRECT} to {VERSION}",
                file.display(),
                stored.version
            ));
        }
        let mut dropped = false;
        let names: std::collections::HashSet<&str> =
            (stored.exchanges.iter()).map(|x| x.name.as_str()).collect();
        let mut unbound = Vec::new();
        for stored in &stored.exchanges {
            let bound = !(stored.bindings.is_empty() && stored.exchange_bindings.is_empty());
            let exchange = exchanges.by_name.entry(stored.name.clone()).or_default();
            exchange.shape = Shape {
                kind: stored.kind,
                durable: true,
                auto_delete: stored.auto_delete,
                internal: stored.internal,
                alternate: stored.alternate_exchange.clone(),
            };
            for (key, queue) in &stored.bindings {
                if queue_exists(queue) {
                    let queues = exchange.bindings.entry(key.clone()).or_default();
                    queues.insert(queue.clone(), true);
                } else {
                    dropped = true;
                }
            }
            for (key, destination) in &stored.exchange_bindings {
                // The server's own exchanges are in the file only where they have bindings.
                if names.contains(destination.as_str()) || destination.starts_with("amq.") {
                    let to = exchange.to_exchanges.entry(key.clone()).or_default();
                    to.insert(destination.clone(), true);
                } else {
                    dropped = true;
                }
            }
            if bound && exchange.is_unbound() {
                unbound.push(stored.name.clone());
            }
        }
        // An auto-delete exchange whose last binding went with its queue goes too.
        for name in unbound {
            exchanges.remove_if_auto_delete(&name);
        }
        // A binding whose queue did not come back is gone for good: a queue declared later
        // under that name must not find it in the file after the next restart.
        if dropped {
            write_atomically(&file, exchanges.stored_text().as_bytes())
                .map_err(|(e, _)| format!("cannot write {}: {e}", file.display()))?;
        }
        Ok(exchanges)
    }

    /// Applies `change`, and with a data dir writes the durable exchanges before the
    /// change counts; if writing fails, nothing changed.
    pub(super) fn keep<T>(
        &mut self,
        change: impl FnOnce(&mut Exchanges) -> Result<T, Refusal>,
    ) -> Result<T, Refusal> {
        let Some(file) = self.file.clone() else {
            return change(self);
        };
        let before = self.clone();
        let result = change(self)?;
        let text = self.stored_text();
        if text != before.stored_text() {
            match write_atomically(&file, text.as_bytes()) {
                Ok(()) => {}
                // The new file is in place: the change stands, though a crash may still
                // lose the rename.
                Err((e, true)) => tracing::warn!(
                    "{} was replaced, but fsyncing its directory failed: {e}",
                    file.display()
                ),
                Err((e, false)) => {
                    *self = before;
                    return Err(Refusal::Storage(format!(
                        "cannot write {}: {e}",
                        file.display()
                    )));
                }
            }
        }
        Ok(result)
    }

    /// The durable exchanges as [`FILE`] holds them, in name order.
    pub(super) fn stored_text(&self) -> String {
        let kept = |bindings: &Bindings| -> Vec<(String, String)> {
            (bindings.iter())
                .flat_map(|(key, to)| {
                    (to.iter())
                        .filter(|(_, kept)| **kept)
                        .map(|(name, _)| (key.clone(), name.clone()))
                })
                .collect()
        };
        let mut exchanges: Vec<StoredExchange> = (self.by_name.iter())
            .filter(|(_, x)| x.shape.durable)
            .map(|(name, x)| StoredExchange {
                name: name.clone(),
                kind: x.shape.kind,
                auto_delete: x.shape.auto_delete,
                internal: x.shape.internal,
                alternate_exchange: x.shape.alternate.clone(),
                bindings: kept(&x.bindings),
                exchange_bindings: kept(&x.to_exchanges),
            })
            // The server's own exchanges are there at every start: kept for their
            // bindings only.
            .filter(|x| {
                let bound = !(x.bindings.is_empty() && x.exchange_bindings.is_empty());
                !x.name.starts_with("amq.") || bound
            })
            .collect();
        exchanges.sort_by(|a, b| a.name.cmp(&b.name));
        let linked = (exchanges.iter()).any(|x| {
            !x.exchange_bindings.is_empty() || x.internal || x.alternate_exchange.is_some()
        });
        let typed = (exchanges.iter()).any(|x| x.kind != Kind::Direct || x.auto_delete);
        let version = match (linked, typed) {
            (true, _) => VERSION,
            (false, true) => VERSION_TYPED,
            (false, false) => VERSION_DIRECT,
        };
        let stored = Stored { version, exchanges };
        serde_json::to_string_pretty(&stored).expect("plain data serialises")
    }
}
