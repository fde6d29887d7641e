//! The exchanges and bindings of a virtual host as lists, for the management API: what
//! `exchange.declare` set of each, and each binding with its routing key or, on a headers
//! exchange, the arguments it was made with.

use serde_json::{Map, Value};

use super::matching::HeadersBinding;
use super::{Exchanges, Kind, Shape};

/// One binding as the API lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct Binding {
    /// The exchange it routes from.
    pub source: String,
    /// The queue (its broker name) or exchange it routes to.
    pub destination: String,
    /// Whether the destination is a queue (else an exchange).
    pub to_queue: bool,
    /// Its routing key (empty on a headers exchange).
    pub routing_key: String,
    /// Its arguments (a headers exchange's match).
    pub arguments: Map<String, Value>,
}

impl Shape {
    /// What this shape says of `arg` (one [`Shape::inequivalent`] names), as RabbitMQ's
    /// text of an inequivalent redeclare writes it.
    pub fn word(&self, arg: &str) -> String {
        match arg {
            "type" => format!("{:?}", self.kind).to_lowercase(),
            "durable" => self.durable.to_string(),
            "auto_delete" => self.auto_delete.to_string(),
            "internal" => self.internal.to_string(),
            _ => self.alternate.clone().unwrap_or_default(),
        }
    }
}

impl Exchanges {
    /// The shape of the exchange `name`, if it exists (not the default one).
    pub fn shape(&self, name: &str) -> Option<Shape> {
        self.by_name.get(name).map(|x| x.shape.clone())
    }

    /// Every exchange but the default one, by name, with its shape.
    pub fn list(&self) -> Vec<(String, Shape)> {
        let mut all: Vec<(String, Shape)> = (self.by_name.iter())
            .map(|(name, x)| (name.clone(), x.shape.clone()))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// Every binding, sorted by source, destination and key.
    pub fn bindings(&self) -> Vec<Binding> {
        let mut all = Vec::new();
        for (source, x) in &self.by_name {
            for (to_queue, table) in [(true, &x.bindings), (false, &x.to_exchanges)] {
                for (key, destinations) in table {
                    let (routing_key, arguments) = match x.shape.kind {
                        Kind::Headers => (String::new(), HeadersBinding::decode(key).arguments()),
                        _ => (key.clone(), Map::new()),
                    };
                    for destination in destinations.keys() {
                        all.push(Binding {
                            source: source.clone(),
                            destination: destination.clone(),
                            to_queue,
                            routing_key: routing_key.clone(),
                            arguments: arguments.clone(),
                        });
                    }
                }
            }
        }
        all.sort_by(|a, b| {
            (&a.source, &a.destination, &a.routing_key).cmp(&(
                &b.source,
                &b.destination,
                &b.routing_key,
            ))
        });
        all
    }
}
