//! Exchanges and bindings: where a `basic.publish` goes.
//!
//! The default exchange (`""`) routes a message to the queue its routing key names and
//! needs no state. A `direct` exchange routes it to every queue bound to it with exactly
//! that routing key; a `fanout` exchange to every queue bound to it, whatever the keys; a
//! `topic` exchange to every queue bound with a pattern the key matches (words between
//! dots, `*` one word, `#` zero or more); a `headers` exchange to every queue bound with
//! arguments the message's headers match (`x-match` `all` or `any`); what a binding
//! matches is in `exchange/matching.rs`. `amq.direct`, `amq.fanout`, `amq.topic`,
//! `amq.match` and `amq.headers` exist from the start, as in RabbitMQ. One table serves
//! every connection of a virtual host.
//!
//! An exchange may also be bound to another exchange (`exchange.bind`): what the source
//! routes to that binding goes on through the destination, with the same routing keys and
//! headers. An exchange with an alternate exchange (the `alternate-exchange` argument)
//! hands what it routes nowhere to that one. As in RabbitMQ, each exchange is passed at
//! most once per publish (so cycles end), each queue gets one copy, and a missing
//! destination or alternate exchange is skipped. An `internal` exchange takes no publishes
//! of its own, only what other exchanges route to it.
//!
//! With a data dir, durable exchanges and their bindings to durable queues are kept in
//! [`FILE`] there (`exchange/store.rs`), as RabbitMQ keeps them: every change to what the file holds is written
//! (to a temporary file, fsynced, renamed over the old one, the directory fsynced) before
//! it is answered. A restart reads the file back and keeps the bindings whose queue came
//! back. Exchanges that are not durable, and bindings of queues that are not, live in
//! memory only.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::PathBuf;

use amq_protocol::types::FieldTable;
use serde::{Deserialize, Serialize};

use crate::names;

mod listing;
mod matching;
mod store;

pub use listing::Binding;
pub use matching::{header_value, topic_matches, HeadersBinding};
use matching::{matching, LazyHeaders};
pub(crate) use store::write_atomically;

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
    /// Its virtual host's name.
    vhost: String,
    /// The start of its virtual host's queues' broker names (`names::vhost_prefix`): the
    /// default exchange routes a key to the queue of that name in its virtual host.
    queue_prefix: String,
}

/// One exchange: queue names by routing key (a pattern for a topic exchange), each with
/// whether the binding is kept on disk (its queue is durable and not exclusive), and the
/// same for the exchanges bound to it.
#[derive(Debug, Default, Clone)]
struct Exchange {
    shape: Shape,
    bindings: Bindings,
    /// Destination exchanges by key, each with whether the binding is kept on disk (the
    /// destination is durable).
    to_exchanges: Bindings,
}

/// Destinations (queues or exchanges) by routing key, or by a topic pattern or an encoded
/// [`HeadersBinding`] in the key's place, each with whether its binding is kept on disk.
type Bindings = BTreeMap<String, BTreeMap<String, bool>>;

/// What `exchange.declare` sets, and a redeclare must name again.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Shape {
    /// How it routes.
    pub kind: Kind,
    /// Kept across a restart, with its bindings to what is durable too.
    pub durable: bool,
    /// Deleted when its last binding goes (RabbitMQ's auto-delete; one never bound stays).
    pub auto_delete: bool,
    /// Takes no publishes, only what other exchanges route to it.
    pub internal: bool,
    /// Where what this exchange routes nowhere goes (`alternate-exchange`).
    pub alternate: Option<String>,
}

impl Shape {
    /// An exchange of `kind`, neither durable, auto-delete nor internal, with no alternate.
    pub fn of(kind: Kind) -> Shape {
        Shape {
            kind,
            ..Shape::default()
        }
    }

    /// The first argument in which `self`, an existing exchange, and `other`, a redeclare of
    /// it, differ, in the order RabbitMQ checks them.
    fn inequivalent(&self, other: &Shape) -> Option<&'static str> {
        if self.kind != other.kind {
            Some("type")
        } else if self.durable != other.durable {
            Some("durable")
        } else if self.auto_delete != other.auto_delete {
            Some("auto_delete")
        } else if self.internal != other.internal {
            Some("internal")
        } else if self.alternate != other.alternate {
            Some("alternate-exchange")
        } else {
            None
        }
    }
}

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
            let shape = Shape {
                durable: true,
                ..Shape::of(kind)
            };
            let exchange = Exchange {
                shape,
                ..Exchange::default()
            };
            by_name.insert(name.to_string(), exchange);
        }
        Exchanges {
            by_name,
            file: None,
            vhost: "/".to_string(),
            queue_prefix: String::new(),
        }
    }
}

impl Exchanges {
    /// The exchanges of the virtual host `vhost`: its default exchange routes to that
    /// virtual host's queues.
    pub fn in_vhost(mut self, vhost: &str) -> Exchanges {
        self.vhost = vhost.to_string();
        self.queue_prefix = names::vhost_prefix(vhost);
        self
    }

    /// The name of its virtual host.
    pub fn vhost(&self) -> &str {
        &self.vhost
    }

    /// How many exchanges there are, the default exchange included.
    pub fn len(&self) -> usize {
        self.by_name.len() + 1
    }

    /// Whether there are none: never, there is always the default exchange.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Whether an exchange of that name exists (the default one always does).
    pub fn exists(&self, name: &str) -> bool {
        name.is_empty() || self.by_name.contains_key(name)
    }

    /// The type of the exchange called `name`, if one is (the default exchange is direct).
    pub fn kind(&self, name: &str) -> Option<Kind> {
        match name {
            "" => Some(Kind::Direct),
            name => self.by_name.get(name).map(|x| x.shape.kind),
        }
    }

    /// Whether `name` is an internal exchange, which takes no publishes of its own.
    pub fn is_internal(&self, name: &str) -> bool {
        self.by_name.get(name).is_some_and(|x| x.shape.internal)
    }

    /// `exchange.declare` of a `kind` exchange, neither internal nor with an alternate:
    /// made when new, checked against the existing one otherwise.
    pub fn declare(
        &mut self,
        name: &str,
        kind: Kind,
        durable: bool,
        auto_delete: bool,
    ) -> Result<(), Refusal> {
        let shape = Shape {
            durable,
            auto_delete,
            ..Shape::of(kind)
        };
        self.declare_shaped(name, shape)
    }

    /// `exchange.declare`: made when new, checked against the existing one otherwise.
    pub fn declare_shaped(&mut self, name: &str, shape: Shape) -> Result<(), Refusal> {
        self.keep(|x| x.declare_here(name, shape))
    }

    fn declare_here(&mut self, name: &str, shape: Shape) -> Result<(), Refusal> {
        if let Some(existing) = self.by_name.get(name) {
            return match existing.shape.inequivalent(&shape) {
                Some(what) => Err(Refusal::Inequivalent(what)),
                None => Ok(()),
            };
        }
        if name.is_empty() || name.starts_with("amq.") {
            return Err(Refusal::Reserved);
        }
        let exchange = Exchange {
            shape,
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
        // As RabbitMQ: in use means bound as a source; bindings to it go with it.
        if if_unused && !exchange.is_unbound() {
            return Err(Refusal::InUse);
        }
        self.remove(name);
        Ok(())
    }

    /// Removes exchange `name` and every binding to it; a source that loses its last
    /// binding so and is auto-delete goes too (and so on, as in RabbitMQ).
    fn remove(&mut self, name: &str) {
        let mut gone = vec![name.to_string()];
        while let Some(name) = gone.pop() {
            if self.by_name.remove(&name).is_none() {
                continue;
            }
            for (source, exchange) in &mut self.by_name {
                let unbound = exchange.forget_destination(&name) && exchange.is_unbound();
                if unbound && exchange.shape.auto_delete {
                    gone.push(source.clone());
                }
            }
        }
    }

    /// Removes exchange `name` if it is auto-delete and has no bindings left.
    fn remove_if_auto_delete(&mut self, name: &str) {
        let unbound = self.by_name.get(name);
        if unbound.is_some_and(|x| x.shape.auto_delete && x.is_unbound()) {
            self.remove(name);
        }
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
        self.remove_binding(exchange, key, queue, |x| &mut x.bindings);
        Ok(())
    }

    /// Removes the binding of `source` with `key` to `destination` from the bindings
    /// `which` picks (to queues, or to exchanges); an auto-delete source goes with its
    /// last. As RabbitMQ: removing a binding from an exchange that is not there succeeds.
    fn remove_binding(
        &mut self,
        source: &str,
        key: &str,
        destination: &str,
        which: fn(&mut Exchange) -> &mut Bindings,
    ) {
        let Some(found) = self.by_name.get_mut(source) else {
            return;
        };
        let bindings = which(found);
        if let Some(to) = bindings.get_mut(key) {
            if to.remove(destination).is_some() && to.is_empty() {
                bindings.remove(key);
                self.remove_if_auto_delete(source);
            }
        }
    }

    /// `exchange.bind`: `destination` gets what `source` routes with `key`. The binding is
    /// kept on disk if both exchanges are durable (as RabbitMQ keeps it).
    pub fn bind_exchange(
        &mut self,
        source: &str,
        key: &str,
        destination: &str,
    ) -> Result<(), Refusal> {
        self.keep(|x| {
            if source.is_empty() || destination.is_empty() {
                return Err(Refusal::Reserved);
            }
            let found = x.by_name.get(destination).ok_or(Refusal::NotFound)?;
            let durable = found.shape.durable;
            let source = x.by_name.get_mut(source).ok_or(Refusal::NotFound)?;
            let to = source.to_exchanges.entry(key.to_string()).or_default();
            to.insert(destination.to_string(), durable);
            Ok(())
        })
    }

    /// `exchange.unbind`; as `queue.unbind`, removing a binding that is not there (or
    /// whose exchanges are not) succeeds.
    pub fn unbind_exchange(
        &mut self,
        source: &str,
        key: &str,
        destination: &str,
    ) -> Result<(), Refusal> {
        self.keep(|x| {
            if source.is_empty() || destination.is_empty() {
                return Err(Refusal::Reserved);
            }
            x.remove_binding(source, key, destination, |x| &mut x.to_exchanges);
            Ok(())
        })
    }

    /// Forgets every binding of a deleted queue. The queue is gone either way: should
    /// writing that fail, the file keeps bindings that a restart drops with the queue, or
    /// that a queue declared again under the name gets back (as a new binding would).
    pub fn unbind_queue(&mut self, queue: &str) -> Result<(), Refusal> {
        self.keep(|x| {
            let mut unbound = Vec::new();
            for (name, exchange) in &mut x.by_name {
                let bound = !exchange.is_unbound();
                exchange.bindings.retain(|_, queues| {
                    queues.remove(queue);
                    !queues.is_empty()
                });
                if bound && exchange.is_unbound() {
                    unbound.push(name.clone());
                }
            }
            // An auto-delete exchange goes with its last binding.
            for name in unbound {
                x.remove_if_auto_delete(&name);
            }
            Ok(())
        })
    }

    /// The queues a publish to `exchange` with `key` goes to, as [`Exchanges::route_keys`].
    pub fn route(
        &self,
        exchange: &str,
        key: &str,
        headers: impl FnOnce() -> Option<FieldTable>,
    ) -> Option<Vec<String>> {
        self.route_keys(exchange, &[key], headers)
    }

    /// The queues a publish to `exchange` with routing keys `keys` (its own and its `CC`
    /// and `BCC` keys) goes to, in name order and each once; `None` when there is no such
    /// exchange. The default exchange routes to the queues the keys name. Each exchange the
    /// message passes routes it with every key; one that routes it nowhere (to no queue
    /// and no exchange) hands it to its alternate, if it has one. A headers exchange asks
    /// `headers` for the message's headers (asked once at most, and only by one, so that
    /// no other publish pays for parsing them).
    pub fn route_keys(
        &self,
        exchange: &str,
        keys: &[&str],
        headers: impl FnOnce() -> Option<FieldTable>,
    ) -> Option<Vec<String>> {
        // The default exchange routes to the queues the keys name, by their broker names
        // (`names.rs`); bindings keep broker names already.
        let prefix = self.queue_prefix.as_str();
        let by_name = || {
            keys.iter()
                .map(|key| names::engine_in(prefix, key).into_owned())
        };
        if exchange.is_empty() {
            let queues: BTreeSet<String> = by_name().collect();
            return Some(queues.into_iter().collect());
        }
        let mut next = Some(self.by_name.get(exchange)?);
        let mut headers = LazyHeaders::Unread(Some(headers));
        let mut queues: BTreeSet<&str> = BTreeSet::new();
        let mut named: BTreeSet<String> = BTreeSet::new();
        // The exchanges passed besides the first, and those still to pass: neither
        // allocates for a publish that only the first exchange routes.
        let mut seen: HashSet<&str> = HashSet::new();
        let mut work = Vec::new();
        while let Some(x) = next.take().or_else(|| work.pop()) {
            let mut routed = false;
            let kind = x.shape.kind;
            matching(kind, &x.bindings, keys, &mut headers, |queue| {
                routed = true;
                queues.insert(queue);
            });
            matching(kind, &x.to_exchanges, keys, &mut headers, |to| {
                routed = true;
                if to != exchange && seen.insert(to) {
                    work.extend(self.by_name.get(to));
                }
            });
            if let (false, Some(alternate)) = (routed, &x.shape.alternate) {
                if alternate.is_empty() {
                    // The default exchange as an alternate: the queues the keys name.
                    named.extend(by_name());
                } else if alternate != exchange && seen.insert(alternate) {
                    work.extend(self.by_name.get(alternate));
                }
            }
        }
        named.extend(queues.into_iter().map(str::to_string));
        Some(named.into_iter().collect())
    }
}

impl Exchange {
    /// Whether it has no binding as a source, to queues or exchanges.
    fn is_unbound(&self) -> bool {
        self.bindings.is_empty() && self.to_exchanges.is_empty()
    }

    /// Removes its bindings to exchange `name`; whether it had any.
    fn forget_destination(&mut self, name: &str) -> bool {
        let mut found = false;
        self.to_exchanges.retain(|_, to| {
            found |= to.remove(name).is_some();
            !to.is_empty()
        });
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use amq_protocol::types::AMQPValue;

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

    #[test]
    fn exchange_to_exchange_bindings_pass_each_exchange_once_and_each_queue_one_copy() {
        let mut x = Exchanges::default();
        x.declare("front", Kind::Direct, false, false).unwrap();
        x.declare("mid", Kind::Fanout, false, false).unwrap();
        x.declare("events", Kind::Topic, false, false).unwrap();
        x.bind("front", "a", "direct-a", false).unwrap();
        x.bind_exchange("front", "b", "mid").unwrap();
        x.bind_exchange("front", "a", "mid").unwrap();
        x.bind("mid", "", "all", false).unwrap();
        x.bind("mid", "", "direct-a", false).unwrap();
        x.bind_exchange("mid", "", "events").unwrap();
        x.bind("events", "b.#", "b-events", false).unwrap();
        // A cycle back to the front and an exchange bound to itself end there.
        x.bind_exchange("events", "#", "front").unwrap();
        x.bind_exchange("mid", "", "mid").unwrap();
        assert_eq!(
            x.route("front", "a", || None).unwrap(),
            ["all", "direct-a"],
            "direct-a by two ways, one copy"
        );
        assert_eq!(
            x.route("front", "b.x", || None).unwrap(),
            Vec::<String>::new(),
            "the direct front routes b.x nowhere"
        );
        assert_eq!(
            x.route("front", "b", || None).unwrap(),
            ["all", "b-events", "direct-a"],
            "through mid, and on through events (b.# matches b)"
        );
        x.unbind("events", "b.#", "b-events").unwrap();
        x.bind("events", "*.x", "x-events", false).unwrap();
        assert_eq!(
            x.route_keys("front", &["b", "b.x"], || None).unwrap(),
            ["all", "direct-a", "x-events"],
            "every key at each exchange: front routes b only, events matches b.x"
        );
        assert_eq!(
            x.route("mid", "b.x", || None).unwrap(),
            ["all", "direct-a", "x-events"]
        );
        // A headers exchange downstream asks for the headers, once.
        x.declare("by-header", Kind::Headers, false, false).unwrap();
        let wants = HeadersBinding::from_arguments(&table(&[("kind", text("x"))])).unwrap();
        x.bind("by-header", &wants.encode(), "x-kind", false)
            .unwrap();
        x.bind_exchange("mid", "", "by-header").unwrap();
        let mut asked = 0;
        let routed = x.route("front", "a", || {
            asked += 1;
            Some(table(&[("kind", text("x"))]))
        });
        assert_eq!(routed.unwrap(), ["all", "direct-a", "x-kind"]);
        assert_eq!(asked, 1);
        // Unbinding stops the flow; unbinding what is not there is fine.
        x.unbind_exchange("front", "a", "mid").unwrap();
        x.unbind_exchange("front", "a", "mid").unwrap();
        x.unbind_exchange("missing", "a", "mid").unwrap();
        assert_eq!(x.route("front", "a", || None).unwrap(), ["direct-a"]);
        assert_eq!(x.bind_exchange("", "a", "mid"), Err(Refusal::Reserved));
        assert_eq!(x.bind_exchange("mid", "a", ""), Err(Refusal::Reserved));
        assert_eq!(
            x.bind_exchange("missing", "a", "mid"),
            Err(Refusal::NotFound)
        );
        assert_eq!(
            x.bind_exchange("mid", "a", "missing"),
            Err(Refusal::NotFound)
        );
    }

    #[test]
    fn an_alternate_exchange_gets_what_its_exchange_routes_nowhere() {
        let mut x = Exchanges::default();
        let with_alternate = |alternate: &str| Shape {
            alternate: Some(alternate.to_string()),
            ..Shape::of(Kind::Direct)
        };
        x.declare_shaped("orders", with_alternate("unrouted"))
            .unwrap();
        x.declare("unrouted", Kind::Fanout, false, false).unwrap();
        x.declare("empty", Kind::Fanout, false, false).unwrap();
        x.bind("orders", "paid", "billing", false).unwrap();
        x.bind("unrouted", "", "lost-and-found", false).unwrap();
        assert_eq!(x.route("orders", "paid", || None).unwrap(), ["billing"]);
        assert_eq!(
            x.route("orders", "refunded", || None).unwrap(),
            ["lost-and-found"]
        );
        assert_eq!(
            x.route_keys("orders", &["refunded", "paid"], || None)
                .unwrap(),
            ["billing"],
            "one key routed: no alternate"
        );
        // Routed to an exchange is routed, even where that exchange routes it nowhere.
        x.bind_exchange("orders", "shipped", "empty").unwrap();
        assert!(x.route("orders", "shipped", || None).unwrap().is_empty());
        // Alternates of alternates, in a cycle, end; a missing one is skipped.
        x.declare_shaped("a", with_alternate("b")).unwrap();
        x.declare_shaped("b", with_alternate("a")).unwrap();
        x.declare_shaped("c", with_alternate("nowhere")).unwrap();
        assert!(x.route("a", "k", || None).unwrap().is_empty());
        assert!(x.route("c", "k", || None).unwrap().is_empty());
        x.bind("b", "k", "from-b", false).unwrap();
        assert_eq!(x.route("a", "k", || None).unwrap(), ["from-b"]);
    }

    #[test]
    fn a_redeclare_names_the_first_difference_as_rabbitmq_checks_them() {
        let mut x = Exchanges::default();
        let shape = Shape {
            internal: true,
            alternate: Some("spare".to_string()),
            ..Shape::of(Kind::Fanout)
        };
        x.declare_shaped("hidden", shape.clone()).unwrap();
        x.declare_shaped("hidden", shape.clone()).unwrap();
        assert!(x.is_internal("hidden") && !x.is_internal("amq.direct"));
        let differing = [
            (
                "type",
                Shape {
                    kind: Kind::Direct,
                    internal: false,
                    ..shape.clone()
                },
            ),
            (
                "durable",
                Shape {
                    durable: true,
                    internal: false,
                    ..shape.clone()
                },
            ),
            (
                "auto_delete",
                Shape {
                    auto_delete: true,
                    alternate: None,
                    ..shape.clone()
                },
            ),
            (
                "internal",
                Shape {
                    internal: false,
                    alternate: None,
                    ..shape.clone()
                },
            ),
            (
                "alternate-exchange",
                Shape {
                    alternate: None,
                    ..shape.clone()
                },
            ),
            (
                "alternate-exchange",
                Shape {
                    alternate: Some("other".into()),
                    ..shape.clone()
                },
            ),
        ];
        for (what, other) in differing {
            assert_eq!(
                x.declare_shaped("hidden", other),
                Err(Refusal::Inequivalent(what))
            );
        }
    }

    #[test]
    fn deleting_an_exchange_takes_the_bindings_to_it_and_auto_delete_sources_go_with_theirs() {
        let mut x = Exchanges::default();
        x.declare("source", Kind::Fanout, false, true).unwrap();
        x.declare("upstream", Kind::Fanout, false, true).unwrap();
        x.declare("sink", Kind::Fanout, false, false).unwrap();
        x.bind_exchange("upstream", "", "source").unwrap();
        x.bind_exchange("source", "", "sink").unwrap();
        // In use means bound as a source: sink is only a destination.
        assert_eq!(x.delete("source", true), Err(Refusal::InUse));
        x.delete("sink", true).unwrap();
        assert!(
            !x.exists("source") && !x.exists("upstream"),
            "each lost its last binding, in turn"
        );
        // The same through an unbind, and through a queue's going.
        x.declare("source", Kind::Fanout, false, true).unwrap();
        x.declare("sink", Kind::Fanout, false, false).unwrap();
        x.bind_exchange("source", "", "sink").unwrap();
        x.bind("source", "", "q", false).unwrap();
        x.unbind_exchange("source", "", "sink").unwrap();
        assert!(x.exists("source"), "still bound to q");
        x.unbind_queue("q").unwrap();
        assert!(!x.exists("source"));
    }
}

#[cfg(test)]
mod kept {
    use std::fs;

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

    /// Bindings between durable exchanges, internal exchanges and alternates come back;
    /// a binding to an exchange that is not durable does not, nor one whose destination
    /// is not in the file.
    #[test]
    fn exchange_bindings_internal_and_alternate_exchanges_survive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let mut x = Exchanges::open(dir.path(), |_| true).unwrap();
        let shape = Shape {
            durable: true,
            alternate: Some("spare".to_string()),
            ..Shape::of(Kind::Direct)
        };
        x.declare_shaped("front", shape.clone()).unwrap();
        let hidden = Shape {
            durable: true,
            internal: true,
            ..Shape::of(Kind::Fanout)
        };
        x.declare_shaped("hidden", hidden.clone()).unwrap();
        x.declare("spare", Kind::Fanout, true, false).unwrap();
        x.declare("scratch", Kind::Fanout, false, false).unwrap();
        x.bind_exchange("front", "k", "hidden").unwrap();
        x.bind_exchange("front", "k", "scratch").unwrap();
        x.bind_exchange("amq.direct", "k", "hidden").unwrap();
        x.bind("hidden", "", "jobs", true).unwrap();
        x.bind("spare", "", "unrouted", true).unwrap();
        let text = fs::read_to_string(dir.path().join(FILE)).unwrap();
        assert!(text.contains(r#""version": 3"#), "{text}");
        let back = Exchanges::open(dir.path(), |_| true).unwrap();
        assert_eq!(back.route("front", "k", || None).unwrap(), ["jobs"]);
        assert_eq!(back.route("amq.direct", "k", || None).unwrap(), ["jobs"]);
        assert_eq!(back.route("front", "other", || None).unwrap(), ["unrouted"]);
        assert!(back.is_internal("hidden") && !back.exists("scratch"));
        let mut again = back.clone();
        assert_eq!(again.declare_shaped("front", shape), Ok(()));
        assert_eq!(again.declare_shaped("hidden", hidden), Ok(()));
        // A destination missing from the file: the binding is dropped, for good.
        let edited = text.replace(r#""name": "hidden""#, r#""name": "renamed""#);
        fs::write(dir.path().join(FILE), edited).unwrap();
        let back = Exchanges::open(dir.path(), |_| true).unwrap();
        assert_eq!(
            back.route("front", "k", || None).unwrap(),
            ["unrouted"],
            "routed nowhere now: to the alternate"
        );
        assert_eq!(back.route("renamed", "", || None).unwrap(), ["jobs"]);
        let text = fs::read_to_string(dir.path().join(FILE)).unwrap();
        assert!(!text.contains("hidden"), "{text}");
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
