//! Exchanges and bindings: where a `basic.publish` goes.
//!
//! The default exchange (`""`) routes a message to the queue its routing key names and
//! needs no state. A `direct` exchange routes it to every queue bound to it with exactly
//! that routing key. `amq.direct` exists from the start, as in RabbitMQ. One table serves
//! every connection of a server; it lives in memory (a restart forgets exchanges and
//! bindings, while durable queues come back).

use std::collections::{BTreeMap, BTreeSet, HashMap};

/// The exchange type served.
pub const DIRECT: &str = "direct";

/// The exchanges of one server, with their bindings.
#[derive(Debug)]
pub struct Exchanges {
    by_name: HashMap<String, Exchange>,
}

/// One direct exchange: queue names by routing key.
#[derive(Debug, Default)]
struct Exchange {
    durable: bool,
    bindings: BTreeMap<String, BTreeSet<String>>,
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
}

impl Default for Exchanges {
    fn default() -> Exchanges {
        let mut by_name = HashMap::new();
        let amq_direct = Exchange {
            durable: true,
            ..Exchange::default()
        };
        by_name.insert("amq.direct".to_string(), amq_direct);
        Exchanges { by_name }
    }
}

impl Exchanges {
    /// Whether an exchange of that name exists (the default one always does).
    pub fn exists(&self, name: &str) -> bool {
        name.is_empty() || self.by_name.contains_key(name)
    }

    /// `exchange.declare` of a direct exchange (the caller checked the type): made when
    /// new, checked against the existing one otherwise.
    pub fn declare(&mut self, name: &str, durable: bool) -> Result<(), Refusal> {
        if let Some(existing) = self.by_name.get(name) {
            if existing.durable != durable {
                return Err(Refusal::Inequivalent("durable"));
            }
            return Ok(());
        }
        if name.is_empty() || name.starts_with("amq.") {
            return Err(Refusal::Reserved);
        }
        let exchange = Exchange {
            durable,
            ..Exchange::default()
        };
        self.by_name.insert(name.to_string(), exchange);
        Ok(())
    }

    /// `exchange.delete`, with its bindings.
    pub fn delete(&mut self, name: &str, if_unused: bool) -> Result<(), Refusal> {
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

    /// `queue.bind`: `queue` gets what `exchange` routes with `key`.
    pub fn bind(&mut self, exchange: &str, key: &str, queue: &str) -> Result<(), Refusal> {
        if exchange.is_empty() {
            return Err(Refusal::Reserved);
        }
        let exchange = self.by_name.get_mut(exchange).ok_or(Refusal::NotFound)?;
        let queues = exchange.bindings.entry(key.to_string()).or_default();
        queues.insert(queue.to_string());
        Ok(())
    }

    /// `queue.unbind`; unbinding what was not bound succeeds.
    pub fn unbind(&mut self, exchange: &str, key: &str, queue: &str) -> Result<(), Refusal> {
        if exchange.is_empty() {
            return Err(Refusal::Reserved);
        }
        let exchange = self.by_name.get_mut(exchange).ok_or(Refusal::NotFound)?;
        if let Some(queues) = exchange.bindings.get_mut(key) {
            queues.remove(queue);
            if queues.is_empty() {
                exchange.bindings.remove(key);
            }
        }
        Ok(())
    }

    /// Forgets every binding of a deleted queue.
    pub fn unbind_queue(&mut self, queue: &str) {
        for exchange in self.by_name.values_mut() {
            exchange.bindings.retain(|_, queues| {
                queues.remove(queue);
                !queues.is_empty()
            });
        }
    }

    /// The queues a publish to `exchange` with `key` goes to, in name order; `None` when
    /// there is no such exchange. The default exchange routes to the queue named `key`.
    pub fn route(&self, exchange: &str, key: &str) -> Option<Vec<String>> {
        if exchange.is_empty() {
            return Some(vec![key.to_string()]);
        }
        let exchange = self.by_name.get(exchange)?;
        let queues = exchange.bindings.get(key);
        Some(queues.map_or_else(Vec::new, |q| q.iter().cloned().collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_direct_exchange_routes_by_exact_key_to_every_bound_queue() {
        let mut x = Exchanges::default();
        x.declare("orders", true).unwrap();
        x.bind("orders", "paid", "billing").unwrap();
        x.bind("orders", "paid", "audit").unwrap();
        x.bind("orders", "shipped", "audit").unwrap();
        x.bind("orders", "paid", "audit").unwrap(); // twice is once
        assert_eq!(x.route("orders", "paid").unwrap(), ["audit", "billing"]);
        assert_eq!(x.route("orders", "shipped").unwrap(), ["audit"]);
        assert!(x.route("orders", "Paid").unwrap().is_empty());
        assert_eq!(x.route("", "anything").unwrap(), ["anything"]);
        assert_eq!(x.route("nowhere", "paid"), None);
        x.unbind("orders", "paid", "audit").unwrap();
        assert_eq!(x.route("orders", "paid").unwrap(), ["billing"]);
        x.unbind_queue("billing");
        assert!(x.route("orders", "paid").unwrap().is_empty());
        assert_eq!(x.route("orders", "shipped").unwrap(), ["audit"]);
    }

    #[test]
    fn reserved_names_mismatches_and_deletes_answer_as_rabbitmq() {
        let mut x = Exchanges::default();
        assert!(x.exists("") && x.exists("amq.direct"));
        assert_eq!(x.declare("amq.mine", true), Err(Refusal::Reserved));
        assert_eq!(x.declare("amq.direct", true), Ok(()));
        assert_eq!(x.bind("", "k", "q"), Err(Refusal::Reserved));
        assert_eq!(x.bind("missing", "k", "q"), Err(Refusal::NotFound));
        x.declare("logs", false).unwrap();
        assert_eq!(
            x.declare("logs", true),
            Err(Refusal::Inequivalent("durable"))
        );
        x.bind("logs", "error", "alerts").unwrap();
        assert_eq!(x.delete("logs", true), Err(Refusal::InUse));
        assert_eq!(x.delete("amq.direct", false), Err(Refusal::Reserved));
        x.delete("logs", false).unwrap();
        assert!(!x.exists("logs"));
        x.delete("logs", false).unwrap();
    }
}
