//! Exchanges and bindings: where a `basic.publish` goes.
//!
//! The default exchange (`""`) routes a message to the queue its routing key names and
//! needs no state. A `direct` exchange routes it to every queue bound to it with exactly
//! that routing key; a `fanout` exchange to every queue bound to it, whatever the keys; a
//! `topic` exchange to every queue bound with a pattern the key matches (words between
//! dots, `*` one word, `#` zero or more); a `headers` exchange to every queue bound with
//! arguments the message's headers match (`x-match` `all` or `any`). `amq.direct`,
//! `amq.fanout`, `amq.topic`, `amq.match` and `amq.headers` exist from the start, as in RabbitMQ. One
//! table serves every connection of a server.
//!
//! With a data dir, durable exchanges and their bindings to durable queues are kept in
//! [`FILE`] there, as RabbitMQ keeps them: every change to what the file holds is written
//! (to a temporary file, fsynced, renamed over the old one, the directory fsynced) before
//! it is answered. A restart reads the file back and keeps the bindings whose queue came
//! back. Exchanges that are not durable, and bindings of queues that are not, live in
//! memory only.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use amq_protocol::types::{AMQPValue, FieldTable};
use serde::{Deserialize, Serialize};

/// The file, in the data dir, that keeps the durable exchanges and their bindings.
pub const FILE: &str = "leasemqd-exchanges.json";

/// How an exchange routes: the AMQP exchange types served.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// To the queues bound with exactly the routing key.
    #[default]
    Direct,
    /// To every bound queue.
    Fanout,
    /// To the queues bound with a pattern the routing key matches.
    Topic,
    /// To the queues bound with arguments the message's headers match.
    Headers,
}

impl Kind {
    fn is_direct(&self) -> bool {
        *self == Kind::Direct
    }

    /// The type `exchange.declare` names, if it is one served.
    pub fn named(name: &str) -> Option<Kind> {
        match name {
            "direct" => Some(Kind::Direct),
            "fanout" => Some(Kind::Fanout),
            "topic" => Some(Kind::Topic),
            "headers" => Some(Kind::Headers),
            _ => None,
        }
    }
}

/// The exchanges of one server, with their bindings.
#[derive(Debug, Clone)]
pub struct Exchanges {
    by_name: HashMap<String, Exchange>,
    /// Where durable exchanges are kept, with a data dir.
    file: Option<PathBuf>,
}

/// One exchange: queue names by routing key (a pattern for a topic exchange), each with
/// whether the binding is kept on disk (its queue is durable and not exclusive).
#[derive(Debug, Default, Clone)]
struct Exchange {
    kind: Kind,
    durable: bool,
    /// Deleted when its last binding goes (RabbitMQ's auto-delete; one never bound stays).
    auto_delete: bool,
    bindings: BTreeMap<String, BTreeMap<String, bool>>,
}

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
    /// (routing key, queue) pairs.
    bindings: Vec<(String, String)>,
}

/// The version of [`Stored`] written where every exchange kept is direct and not
/// auto-delete: what builds that served only those read.
const VERSION_DIRECT: u32 = 1;
/// The version written where one is not: a build that reads only version 1 refuses the
/// file, rather than route a fanout or topic exchange as a direct one.
const VERSION: u32 = 2;

/// Why an exchange call is refused, as AMQP reply codes name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// 403: the default exchange and the `amq.` names are the server's.
    Reserved,
    /// 404: no exchange of that name.
    NotFound,
    /// 406: declared again with another type or durability.
    Inequivalent(&'static str),
    /// 406: `if_unused` and it has bindings.
    InUse,
    /// 541: the change to a durable exchange could not be written (nothing changed).
    Storage(String),
}

impl Default for Exchanges {
    fn default() -> Exchanges {
        let mut by_name = HashMap::new();
        for (name, kind) in [
            ("amq.direct", Kind::Direct),
            ("amq.fanout", Kind::Fanout),
            ("amq.topic", Kind::Topic),
            ("amq.match", Kind::Headers),
            ("amq.headers", Kind::Headers),
        ] {
            let exchange = Exchange {
                kind,
                durable: true,
                ..Exchange::default()
            };
            by_name.insert(name.to_string(), exchange);
        }
        Exchanges {
            by_name,
            file: None,
        }
    }
}

impl Exchanges {
    /// The exchanges kept in `dir` (none yet if it has no [`FILE`]), which keeps every
    /// later change to a durable one; a binding is kept if `queue_exists` says its queue
    /// came back.
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
        for stored in stored.exchanges {
            let bound = !stored.bindings.is_empty();
            let exchange = exchanges.by_name.entry(stored.name.clone()).or_default();
            exchange.durable = true;
            exchange.kind = stored.kind;
            exchange.auto_delete = stored.auto_delete;
            for (key, queue) in stored.bindings {
                if queue_exists(&queue) {
                    exchange
                        .bindings
                        .entry(key)
                        .or_default()
                        .insert(queue, true);
                } else {
                    dropped = true;
                }
            }
            // An auto-delete exchange whose last binding went with its queue goes too.
            if exchange.auto_delete && bound && exchange.bindings.is_empty() {
                exchanges.by_name.remove(&stored.name);
            }
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
    fn keep<T>(
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
    fn stored_text(&self) -> String {
        let mut exchanges: Vec<StoredExchange> = (self.by_name.iter())
            .filter(|(_, x)| x.durable)
            .map(|(name, x)| StoredExchange {
                name: name.clone(),
                kind: x.kind,
                auto_delete: x.auto_delete,
                bindings: (x.bindings.iter())
                    .flat_map(|(key, queues)| {
                        (queues.iter())
                            .filter(|(_, kept)| **kept)
                            .map(|(q, _)| (key.clone(), q.clone()))
                    })
                    .collect(),
            })
            // The server's own exchanges are there at every start: kept for their
            // bindings only.
            .filter(|x| !(x.name.starts_with("amq.") && x.bindings.is_empty()))
            .collect();
        exchanges.sort_by(|a, b| a.name.cmp(&b.name));
        let typed = (exchanges.iter()).any(|x| x.kind != Kind::Direct || x.auto_delete);
        let stored = Stored {
            version: if typed { VERSION } else { VERSION_DIRECT },
            exchanges,
        };
        serde_json::to_string_pretty(&stored).expect("plain data serialises")
    }

    /// Whether an exchange of that name exists (the default one always does).
    pub fn exists(&self, name: &str) -> bool {
        name.is_empty() || self.by_name.contains_key(name)
    }

    /// The type of the exchange called `name`, if one is (the default exchange is direct).
    pub fn kind(&self, name: &str) -> Option<Kind> {
        match name {
            "" => Some(Kind::Direct),
            name => self.by_name.get(name).map(|x| x.kind),
        }
    }

    /// `exchange.declare`: made when new, checked against the existing one otherwise.
    pub fn declare(
        &mut self,
        name: &str,
        kind: Kind,
        durable: bool,
        auto_delete: bool,
    ) -> Result<(), Refusal> {
        self.keep(|x| x.declare_here(name, kind, durable, auto_delete))
    }

    fn declare_here(
        &mut self,
        name: &str,
        kind: Kind,
        durable: bool,
        auto_delete: bool,
    ) -> Result<(), Refusal> {
        if let Some(existing) = self.by_name.get(name) {
            if existing.kind != kind {
                return Err(Refusal::Inequivalent("type"));
            }
            if existing.durable != durable {
                return Err(Refusal::Inequivalent("durable"));
            }
            if existing.auto_delete != auto_delete {
                return Err(Refusal::Inequivalent("auto_delete"));
            }
            return Ok(());
        }
        if name.is_empty() || name.starts_with("amq.") {
            return Err(Refusal::Reserved);
        }
        let exchange = Exchange {
            kind,
            durable,
            auto_delete,
            ..Exchange::default()
        };
        self.by_name.insert(name.to_string(), exchange);
        Ok(())
    }

    /// `exchange.delete`, with its bindings.
    pub fn delete(&mut self, name: &str, if_unused: bool) -> Result<(), Refusal> {
        self.keep(|x| x.delete_here(name, if_unused))
    }

    fn delete_here(&mut self, name: &str, if_unused: bool) -> Result<(), Refusal> {
        if name.is_empty() || name.starts_with("amq.") {
            return Err(Refusal::Reserved);
        }
        let Some(exchange) = self.by_name.get(name) else {
            // As RabbitMQ: deleting what is not there succeeds.
            return Ok(());
        };
        if if_unused && !exchange.bindings.is_empty() {
            return Err(Refusal::InUse);
        }
        self.by_name.remove(name);
        Ok(())
    }

    /// `queue.bind`: `queue` gets what `exchange` routes with `key`. `durable_queue` says
    /// whether the binding may be kept on disk (RabbitMQ keeps a binding when both its
    /// exchange and its queue are durable; an exclusive queue never outlives its
    /// connection).
    pub fn bind(
        &mut self,
        exchange: &str,
        key: &str,
        queue: &str,
        durable_queue: bool,
    ) -> Result<(), Refusal> {
        self.keep(|x| x.bind_here(exchange, key, queue, durable_queue))
    }

    fn bind_here(
        &mut self,
        exchange: &str,
        key: &str,
        queue: &str,
        durable_queue: bool,
    ) -> Result<(), Refusal> {
        if exchange.is_empty() {
            return Err(Refusal::Reserved);
        }
        let exchange = self.by_name.get_mut(exchange).ok_or(Refusal::NotFound)?;
        let queues = exchange.bindings.entry(key.to_string()).or_default();
        queues.insert(queue.to_string(), durable_queue);
        Ok(())
    }

    /// `queue.unbind`; unbinding what was not bound succeeds.
    pub fn unbind(&mut self, exchange: &str, key: &str, queue: &str) -> Result<(), Refusal> {
        self.keep(|x| x.unbind_here(exchange, key, queue))
    }

    fn unbind_here(&mut self, exchange: &str, key: &str, queue: &str) -> Result<(), Refusal> {
        if exchange.is_empty() {
            return Err(Refusal::Reserved);
        }
        // As RabbitMQ: removing a binding from an exchange that is not there succeeds.
        let Some(found) = self.by_name.get_mut(exchange) else {
            return Ok(());
        };
        if let Some(queues) = found.bindings.get_mut(key) {
            if queues.remove(queue).is_some() && queues.is_empty() {
                found.bindings.remove(key);
                if found.auto_delete && found.bindings.is_empty() {
                    self.by_name.remove(exchange);
                }
            }
        }
        Ok(())
    }

    /// Forgets every binding of a deleted queue. The queue is gone either way: should
    /// writing that fail, the file keeps bindings that a restart drops with the queue, or
    /// that a queue declared again under the name gets back (as a new binding would).
    pub fn unbind_queue(&mut self, queue: &str) -> Result<(), Refusal> {
        self.keep(|x| {
            x.by_name.retain(|_, exchange| {
                let bound = !exchange.bindings.is_empty();
                exchange.bindings.retain(|_, queues| {
                    queues.remove(queue);
                    !queues.is_empty()
                });
                // An auto-delete exchange goes with its last binding.
                !(exchange.auto_delete && bound && exchange.bindings.is_empty())
            });
            Ok(())
        })
    }

    /// The queues a publish to `exchange` with `key` goes to, in name order and each once;
    /// `None` when there is no such exchange. The default exchange routes to the queue
    /// named `key`; a headers exchange asks `headers` for the message's headers (only it
    /// does, so that no other publish pays for parsing them).
    pub fn route(
        &self,
        exchange: &str,
        key: &str,
        headers: impl FnOnce() -> Option<FieldTable>,
    ) -> Option<Vec<String>> {
        if exchange.is_empty() {
            return Some(vec![key.to_string()]);
        }
        let exchange = self.by_name.get(exchange)?;
        let queues = match exchange.kind {
            Kind::Direct => {
                let queues = exchange.bindings.get(key);
                return Some(queues.map_or_else(Vec::new, |q| q.keys().cloned().collect()));
            }
            Kind::Fanout => exchange.bindings.values().flat_map(|q| q.keys()).collect(),
            Kind::Topic => (exchange.bindings.iter())
                .filter(|(pattern, _)| topic_matches(pattern, key))
                .flat_map(|(_, q)| q.keys())
                .collect::<std::collections::BTreeSet<_>>(),
            Kind::Headers => {
                let headers = headers();
                (exchange.bindings.iter())
                    .filter(|(binding, _)| {
                        HeadersBinding::decode(binding).matches(headers.as_ref())
                    })
                    .flat_map(|(_, q)| q.keys())
                    .collect()
            }
        };
        Some(queues.into_iter().cloned().collect())
    }
}

/// Whether a topic exchange's binding `pattern` matches routing key `key`: both are words
/// between dots (an empty one is no words at all, as RabbitMQ splits them); `*` in the
/// pattern stands for exactly one word, `#` for zero or more.
pub fn topic_matches(pattern: &str, key: &str) -> bool {
    let (pattern, key) = (words(pattern), words(key));
    // `at[j]`: whether the pattern's words so far can match the key's first `j` words.
    let mut at = vec![false; key.len() + 1];
    at[0] = true;
    for word in pattern {
        let mut next = vec![false; key.len() + 1];
        for j in 0..=key.len() {
            next[j] = match word {
                // Zero words (as before), or one more word after a match.
                "#" => at[j] || (j > 0 && next[j - 1]),
                "*" => j > 0 && at[j - 1],
                word => j > 0 && at[j - 1] && key[j - 1] == word,
            };
        }
        at = next;
    }
    at[key.len()]
}

/// A headers exchange's binding: what its arguments ask of a message's headers. It is
/// kept, in the bindings table and the exchange file, as the text [`encode`] makes in the
/// place of a routing key, which a headers exchange does not read.
///
/// [`encode`]: HeadersBinding::encode
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeadersBinding {
    /// `x-match` `any` (else `all`).
    any: bool,
    /// `x-match` ends `-with-x`: headers named `x-…` count too.
    with_x: bool,
    /// The headers asked for, by name, each value in [`header_value`]'s form (`None`
    /// for a void value: the header's presence is enough).
    pairs: BTreeMap<String, Option<String>>,
}

impl HeadersBinding {
    /// The binding `arguments` ask for.
    ///
    /// # Errors
    ///
    /// An `x-match` that is not `all`, `any`, `all-with-x` or `any-with-x`, as RabbitMQ's
    /// 406 says it.
    pub fn from_arguments(arguments: &FieldTable) -> Result<HeadersBinding, String> {
        let (any, with_x) = match arguments.inner().get("x-match") {
            None => (false, false),
            Some(AMQPValue::LongString(s)) => match s.as_bytes() {
                b"all" => (false, false),
                b"any" => (true, false),
                b"all-with-x" => (false, true),
                b"any-with-x" => (true, true),
                other => {
                    let other = String::from_utf8_lossy(other);
                    return Err(format!("invalid x-match field value \"{other}\"; expected all, any, all-with-x, or any-with-x"));
                }
            },
            Some(other) => return Err(format!("invalid x-match field value {other:?}")),
        };
        let pairs = (arguments.inner().iter())
            .filter(|(name, _)| name.as_str() != "x-match")
            .map(|(name, value)| (name.as_str().to_string(), header_value(value)))
            .collect();
        Ok(HeadersBinding { any, with_x, pairs })
    }

    /// The text kept for this binding.
    pub fn encode(&self) -> String {
        serde_json::to_string(self).expect("plain data serialises")
    }

    /// The binding a kept text holds; one that does not parse matches nothing.
    fn decode(text: &str) -> HeadersBinding {
        serde_json::from_str(text).unwrap_or(HeadersBinding {
            any: true,
            with_x: false,
            pairs: BTreeMap::new(),
        })
    }

    /// Whether a message with `headers` matches: with `all`, every header asked for is
    /// there with its value; with `any`, one is. `all` of nothing matches every message,
    /// `any` of nothing none.
    pub fn matches(&self, headers: Option<&FieldTable>) -> bool {
        let empty = FieldTable::default();
        let headers = headers.unwrap_or(&empty).inner();
        let found = |(name, wanted): (&String, &Option<String>)| {
            if name.starts_with("x-") && !self.with_x {
                return None;
            }
            let value = headers.get(name.as_str());
            Some(match wanted {
                None => value.is_some(),
                Some(wanted) => value.and_then(header_value).as_ref() == Some(wanted),
            })
        };
        let mut results = self.pairs.iter().filter_map(found);
        if self.any {
            results.any(|matched| matched)
        } else {
            results.all(|matched| matched)
        }
    }
}

/// A header value in a form that compares as RabbitMQ compares them (integers of any
/// width alike, short and long strings alike); `None` for a void value.
pub fn header_value(value: &AMQPValue) -> Option<String> {
    let integer = |n: i128| Some(format!("i:{n}"));
    match value {
        AMQPValue::Void => None,
        AMQPValue::Boolean(b) => Some(format!("b:{b}")),
        AMQPValue::ShortShortInt(n) => integer((*n).into()),
        AMQPValue::ShortShortUInt(n) => integer((*n).into()),
        AMQPValue::ShortInt(n) => integer((*n).into()),
        AMQPValue::ShortUInt(n) => integer((*n).into()),
        AMQPValue::LongInt(n) => integer((*n).into()),
        AMQPValue::LongUInt(n) => integer((*n).into()),
        AMQPValue::LongLongInt(n) => integer((*n).into()),
        AMQPValue::Timestamp(n) => Some(format!("t:{n}")),
        AMQPValue::ShortString(s) => Some(format!("s:{}", s.as_str())),
        AMQPValue::LongString(s) => Some(format!("s:{}", String::from_utf8_lossy(s.as_bytes()))),
        other => Some(format!("o:{other:?}")),
    }
}

/// The words of a topic key or pattern: none for an empty one.
fn words(text: &str) -> Vec<&str> {
    match text {
        "" => Vec::new(),
        text => text.split('.').collect(),
    }
}

/// Replaces `file` with `bytes` so that a crash leaves the old contents or the new, never
/// a mix: a temporary file, fsynced, renamed over it, and the directory fsynced. An error
/// says whether the rename was done (only the directory's fsync failed).
fn write_atomically(file: &Path, bytes: &[u8]) -> Result<(), (io::Error, bool)> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_direct_exchange_routes_by_exact_key_to_every_bound_queue() {
        let mut x = Exchanges::default();
        x.declare("orders", Kind::Direct, true, false).unwrap();
        x.bind("orders", "paid", "billing", true).unwrap();
        x.bind("orders", "paid", "audit", true).unwrap();
        x.bind("orders", "shipped", "audit", true).unwrap();
        x.bind("orders", "paid", "audit", true).unwrap(); // twice is once
        assert_eq!(
            x.route("orders", "paid", || None).unwrap(),
            ["audit", "billing"]
        );
        assert_eq!(x.route("orders", "shipped", || None).unwrap(), ["audit"]);
        assert!(x.route("orders", "Paid", || None).unwrap().is_empty());
        assert_eq!(x.route("", "anything", || None).unwrap(), ["anything"]);
        assert_eq!(x.route("nowhere", "paid", || None), None);
        x.unbind("orders", "paid", "audit").unwrap();
        assert_eq!(x.route("orders", "paid", || None).unwrap(), ["billing"]);
        x.unbind_queue("billing").unwrap();
        assert!(x.route("orders", "paid", || None).unwrap().is_empty());
        assert_eq!(x.route("orders", "shipped", || None).unwrap(), ["audit"]);
    }

    #[test]
    fn a_fanout_exchange_routes_to_every_bound_queue_whatever_the_key() {
        let mut x = Exchanges::default();
        x.declare("logs", Kind::Fanout, false, false).unwrap();
        x.bind("logs", "", "one", false).unwrap();
        x.bind("logs", "ignored", "two", false).unwrap();
        x.bind("logs", "other", "two", false).unwrap();
        assert_eq!(
            x.route("logs", "anything", || None).unwrap(),
            ["one", "two"]
        );
        assert_eq!(
            x.route("amq.fanout", "k", || None).unwrap(),
            Vec::<String>::new()
        );
        assert_eq!(
            x.declare("logs", Kind::Direct, false, false),
            Err(Refusal::Inequivalent("type"))
        );
    }

    fn table(pairs: &[(&str, AMQPValue)]) -> FieldTable {
        let mut table = FieldTable::default();
        for (name, value) in pairs {
            table.insert((*name).into(), value.clone());
        }
        table
    }

    fn text(s: &str) -> AMQPValue {
        AMQPValue::LongString(s.into())
    }

    #[test]
    fn a_headers_binding_matches_all_or_any_of_the_headers_it_names() {
        let all = HeadersBinding::from_arguments(&table(&[
            ("format", text("pdf")),
            ("pages", AMQPValue::LongInt(3)),
        ]))
        .unwrap();
        let any = HeadersBinding::from_arguments(&table(&[
            ("x-match", text("any")),
            ("format", text("pdf")),
            ("pages", AMQPValue::LongInt(3)),
        ]))
        .unwrap();
        // Integers of any width compare alike, short and long strings alike.
        let both = table(&[
            ("format", AMQPValue::ShortString("pdf".into())),
            ("pages", AMQPValue::ShortShortUInt(3)),
            ("extra", AMQPValue::Boolean(true)),
        ]);
        let one = table(&[("format", text("pdf")), ("pages", AMQPValue::LongInt(4))]);
        assert!(all.matches(Some(&both)) && any.matches(Some(&both)));
        assert!(!all.matches(Some(&one)) && any.matches(Some(&one)));
        assert!(!all.matches(None) && !any.matches(None));
        // A void value asks only that the header be there.
        let present =
            HeadersBinding::from_arguments(&table(&[("format", AMQPValue::Void)])).unwrap();
        assert!(present.matches(Some(&one)) && !present.matches(None));
        // `x-` headers count only with `-with-x`; `all` of nothing matches every message.
        let x = table(&[("x-tenant", text("a"))]);
        let plain = HeadersBinding::from_arguments(&x).unwrap();
        assert!(plain.matches(None), "nothing asked for");
        let mut with_x = x.clone();
        with_x.insert("x-match".into(), text("all-with-x"));
        let with_x = HeadersBinding::from_arguments(&with_x).unwrap();
        assert!(!with_x.matches(None) && with_x.matches(Some(&x)));
        assert!(HeadersBinding::from_arguments(&table(&[("x-match", text("most"))])).is_err());
    }

    #[test]
    fn a_headers_exchange_routes_each_matching_queue_once_and_keeps_its_bindings() {
        let dir = tempfile::tempdir().unwrap();
        let mut x = Exchanges::open(dir.path(), |_| true).unwrap();
        x.declare("docs", Kind::Headers, true, false).unwrap();
        let pdf = HeadersBinding::from_arguments(&table(&[("format", text("pdf"))])).unwrap();
        let zip = HeadersBinding::from_arguments(&table(&[("format", text("zip"))])).unwrap();
        x.bind("docs", &pdf.encode(), "printer", true).unwrap();
        x.bind("docs", &zip.encode(), "archive", true).unwrap();
        let message = table(&[("format", text("pdf"))]);
        assert_eq!(
            x.route("docs", "k", || Some(message.clone())).unwrap(),
            ["printer"]
        );
        assert!(x.route("docs", "k", || None).unwrap().is_empty());
        let back = Exchanges::open(dir.path(), |_| true).unwrap();
        assert_eq!(back.kind("docs"), Some(Kind::Headers));
        assert_eq!(
            back.route("docs", "k", || Some(message.clone())).unwrap(),
            ["printer"]
        );
        assert_eq!(back.kind("amq.match"), Some(Kind::Headers));
        assert_eq!(back.kind("amq.headers"), Some(Kind::Headers));
    }

    #[test]
    fn a_topic_exchange_routes_by_pattern_each_queue_once() {
        let mut x = Exchanges::default();
        x.declare("events", Kind::Topic, true, false).unwrap();
        x.bind("events", "*.orange.*", "q1", true).unwrap();
        x.bind("events", "*.*.rabbit", "q2", true).unwrap();
        x.bind("events", "lazy.#", "q2", true).unwrap();
        x.bind("events", "#", "all", true).unwrap();
        let route = |key| x.route("events", key, || None).unwrap();
        assert_eq!(route("quick.orange.rabbit"), ["all", "q1", "q2"]);
        assert_eq!(route("lazy.orange.elephant"), ["all", "q1", "q2"]);
        assert_eq!(route("quick.orange.fox"), ["all", "q1"]);
        assert_eq!(route("lazy.brown.fox"), ["all", "q2"]);
        assert_eq!(route("lazy"), ["all", "q2"]);
        assert_eq!(route("quick.brown.fox"), ["all"]);
        assert_eq!(route("orange"), ["all"]);
        assert_eq!(route("quick.orange.male.rabbit"), ["all"]);
    }

    #[test]
    fn topic_patterns_match_words_as_rabbitmq_does() {
        for (pattern, key, matches) in [
            ("a.b", "a.b", true),
            ("a.b", "a.b.c", false),
            ("a.*", "a.b", true),
            ("a.*", "a", false),
            ("a.*", "a.b.c", false),
            ("a.#", "a", true),
            ("a.#", "a.b.c", true),
            ("#.c", "c", true),
            ("#.c", "a.b.c", true),
            ("#.c", "a.b.d", false),
            ("a.#.c", "a.c", true),
            ("a.#.c", "a.x.y.c", true),
            ("*.#", "a", true),
            ("#.#", "a.b", true),
            ("*", "a.b", false),
            ("#", "", true),
            ("*", "", false),
            ("", "", true),
            ("", "a", false),
            ("a.*", "a.", true),
            ("#.#", "", true),
        ] {
            assert_eq!(topic_matches(pattern, key), matches, "{pattern} ~ {key}");
        }
    }

    #[test]
    fn an_auto_delete_exchange_goes_with_its_last_binding() {
        let mut x = Exchanges::default();
        x.declare("replies", Kind::Direct, false, true).unwrap();
        x.unbind("replies", "k", "nobody").unwrap();
        assert!(x.exists("replies"), "never bound: it stays");
        x.bind("replies", "a", "one", false).unwrap();
        x.bind("replies", "b", "two", false).unwrap();
        x.unbind("replies", "a", "one").unwrap();
        assert!(x.exists("replies"), "one binding left");
        x.unbind_queue("two").unwrap();
        assert!(!x.exists("replies"));
        x.declare("plain", Kind::Direct, false, false).unwrap();
        x.bind("plain", "a", "one", false).unwrap();
        x.unbind("plain", "a", "one").unwrap();
        assert!(x.exists("plain"));
        assert_eq!(
            x.declare("plain", Kind::Direct, false, true),
            Err(Refusal::Inequivalent("auto_delete"))
        );
    }

    #[test]
    fn reserved_names_mismatches_and_deletes_answer_as_rabbitmq() {
        let mut x = Exchanges::default();
        assert!(x.exists("") && x.exists("amq.direct"));
        assert_eq!(
            x.declare("amq.mine", Kind::Direct, true, false),
            Err(Refusal::Reserved)
        );
        assert_eq!(x.declare("amq.direct", Kind::Direct, true, false), Ok(()));
        assert_eq!(x.bind("", "k", "q", true), Err(Refusal::Reserved));
        assert_eq!(x.bind("missing", "k", "q", true), Err(Refusal::NotFound));
        x.declare("logs", Kind::Direct, false, false).unwrap();
        assert_eq!(
            x.declare("logs", Kind::Direct, true, false),
            Err(Refusal::Inequivalent("durable"))
        );
        x.bind("logs", "error", "alerts", true).unwrap();
        assert_eq!(x.delete("logs", true), Err(Refusal::InUse));
        assert_eq!(x.delete("amq.direct", false), Err(Refusal::Reserved));
        x.delete("logs", false).unwrap();
        assert!(!x.exists("logs"));
        x.delete("logs", false).unwrap();
    }
}

#[cfg(test)]
mod kept {
    use super::*;

    /// Durable exchanges and their bindings come back from the file, without the bindings
    /// of queues that did not come back; exchanges that are not durable do not.
    #[test]
    fn durable_exchanges_and_bindings_of_queues_that_came_back_survive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let mut x = Exchanges::open(dir.path(), |_| true).unwrap();
        x.declare("orders", Kind::Direct, true, false).unwrap();
        x.declare("scratch", Kind::Direct, false, false).unwrap();
        x.bind("orders", "paid", "billing", true).unwrap();
        x.bind("orders", "paid", "gone", true).unwrap();
        x.bind("orders", "paid", "transient", false).unwrap();
        x.bind("amq.direct", "k", "billing", true).unwrap();
        x.bind("scratch", "k", "billing", true).unwrap();
        x.declare("dropped", Kind::Direct, true, false).unwrap();
        x.delete("dropped", false).unwrap();
        assert_eq!(
            x.route("orders", "paid", || None).unwrap(),
            ["billing", "gone", "transient"]
        );
        let back = Exchanges::open(dir.path(), |q| q != "gone").unwrap();
        assert_eq!(back.route("orders", "paid", || None).unwrap(), ["billing"]);
        assert_eq!(back.route("amq.direct", "k", || None).unwrap(), ["billing"]);
        assert!(!back.exists("scratch") && !back.exists("dropped"));
        // The binding whose queue did not come back left the file too: a queue of that
        // name that exists at the next start does not get it.
        let again = Exchanges::open(dir.path(), |_| true).unwrap();
        assert_eq!(again.route("orders", "paid", || None).unwrap(), ["billing"]);
        // Direct exchanges only: a file a build serving only those reads.
        let text = fs::read_to_string(dir.path().join(FILE)).unwrap();
        assert!(
            text.contains(r#""version": 1"#) && !text.contains("kind"),
            "{text}"
        );
        // So does each exchange's type; a file from before types had none: direct.
        let mut typed = Exchanges::open(dir.path(), |_| true).unwrap();
        typed.declare("events", Kind::Topic, true, false).unwrap();
        typed.bind("events", "a.*", "billing", true).unwrap();
        let text = fs::read_to_string(dir.path().join(FILE)).unwrap();
        assert!(text.contains(r#""version": 2"#), "{text}");
        typed.declare("replies", Kind::Direct, true, true).unwrap();
        typed.bind("replies", "k", "gone", true).unwrap();
        let back = Exchanges::open(dir.path(), |q| q != "gone").unwrap();
        assert!(
            !back.exists("replies"),
            "its last binding went with its queue"
        );
        let back = Exchanges::open(dir.path(), |_| true).unwrap();
        assert_eq!(back.kind("events"), Some(Kind::Topic));
        assert_eq!(back.route("events", "a.b", || None).unwrap(), ["billing"]);
        let old = r#"{"version": 1, "exchanges": [{"name": "orders", "bindings": [["paid", "billing"]]}]}"#;
        fs::write(dir.path().join(FILE), old).unwrap();
        let back = Exchanges::open(dir.path(), |_| true).unwrap();
        assert_eq!(back.kind("orders"), Some(Kind::Direct));
        assert_eq!(back.route("orders", "paid", || None).unwrap(), ["billing"]);
        // Without a data dir nothing is kept anywhere.
        let mut memory = Exchanges::default();
        memory.declare("orders", Kind::Direct, true, false).unwrap();
        assert!(memory.file.is_none());
    }

    /// A change that cannot be written is refused and changes nothing; a damaged file
    /// stops the server from starting, naming the file.
    #[test]
    fn a_write_that_fails_changes_nothing_and_a_damaged_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut x = Exchanges::open(dir.path(), |_| true).unwrap();
        x.declare("orders", Kind::Direct, true, false).unwrap();
        // A directory where the temporary file would go makes the write fail.
        fs::create_dir(dir.path().join(FILE).with_extension("json.tmp")).unwrap();
        assert!(matches!(
            x.bind("orders", "k", "q", true),
            Err(Refusal::Storage(_))
        ));
        assert!(x.route("orders", "k", || None).unwrap().is_empty());
        // Changes to exchanges that are not durable need no write.
        x.declare("scratch", Kind::Direct, false, false).unwrap();
        x.bind("scratch", "k", "q", true).unwrap();
        fs::write(dir.path().join(FILE), b"{ not json").unwrap();
        let err = Exchanges::open(dir.path(), |_| true).unwrap_err();
        assert!(err.contains(FILE), "{err}");
    }
}
