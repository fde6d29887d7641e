//! RabbitMQ's definitions file, the JSON `rabbitmqctl export_definitions` writes and
//! `--definitions` reads: its users, virtual hosts and permissions, and the queues,
//! exchanges and bindings to declare at start. A RabbitMQ export loads unchanged: keys
//! leasemqd has no use for (policies, parameters, limits, topic permissions) are named in
//! [`Definitions::skipped`] for the log, never an error.
//!
//! Parsing only checks the shape; [`super::Access::from_definitions`] checks the meaning
//! (hashes, regular expressions, what refers to what).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A definitions file, as far as leasemqd reads it.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct Definitions {
    /// The users.
    #[serde(default)]
    pub users: Vec<UserDef>,
    /// The virtual hosts (`/` exists whether listed or not).
    #[serde(default)]
    pub vhosts: Vec<VHostDef>,
    /// Each user's permissions in each virtual host it may use.
    #[serde(default)]
    pub permissions: Vec<PermissionDef>,
    /// Queues to declare at start.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub queues: Vec<QueueDef>,
    /// Exchanges to declare at start.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exchanges: Vec<ExchangeDef>,
    /// Bindings to make at start.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bindings: Vec<BindingDef>,
    /// Every other key, kept to be named in the log.
    #[serde(flatten, skip_serializing)]
    pub other: BTreeMap<String, Value>,
}

/// A user.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UserDef {
    /// Its name.
    pub name: String,
    /// RabbitMQ's salted hash, base64; empty for a user that cannot log in with a
    /// password (one that shows a client certificate, say).
    #[serde(default)]
    pub password_hash: String,
    /// `rabbit_password_hashing_sha256` (RabbitMQ's default, also where missing) or
    /// `rabbit_password_hashing_sha512`.
    #[serde(default)]
    pub hashing_algorithm: Option<String>,
    /// RabbitMQ's user tags (`administrator`, `monitoring`, …): a list, or in older
    /// exports one string of names separated by commas.
    #[serde(default, deserialize_with = "tags")]
    pub tags: Vec<String>,
}

/// A virtual host.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VHostDef {
    /// Its name.
    pub name: String,
}

/// One user's permissions in one virtual host.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PermissionDef {
    /// The user.
    pub user: String,
    /// The virtual host.
    pub vhost: String,
    /// The regular expression of what it may declare and delete.
    pub configure: String,
    /// … publish to and bind to.
    pub write: String,
    /// … consume, get, purge and bind from.
    pub read: String,
}

/// A queue to declare.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QueueDef {
    /// Its name.
    pub name: String,
    /// Its virtual host.
    pub vhost: String,
    /// Whether it is durable (RabbitMQ's exports say so for every queue).
    #[serde(default)]
    pub durable: bool,
    /// Whether it goes with its last consumer.
    #[serde(default)]
    pub auto_delete: bool,
    /// Its `x-` arguments.
    #[serde(default)]
    pub arguments: serde_json::Map<String, Value>,
}

/// An exchange to declare.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExchangeDef {
    /// Its name.
    pub name: String,
    /// Its virtual host.
    pub vhost: String,
    /// `direct`, `fanout`, `topic` or `headers`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Whether it is durable.
    #[serde(default)]
    pub durable: bool,
    /// Whether it goes with its last binding.
    #[serde(default)]
    pub auto_delete: bool,
    /// Whether clients may not publish to it.
    #[serde(default)]
    pub internal: bool,
    /// Its arguments (`alternate-exchange`).
    #[serde(default)]
    pub arguments: serde_json::Map<String, Value>,
}

/// A binding to make.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BindingDef {
    /// The exchange it routes from.
    pub source: String,
    /// Its virtual host.
    pub vhost: String,
    /// The queue or exchange it routes to.
    pub destination: String,
    /// `queue` or `exchange`.
    pub destination_type: String,
    /// Its routing key.
    #[serde(default)]
    pub routing_key: String,
    /// Its arguments (a headers exchange's match).
    #[serde(default)]
    pub arguments: serde_json::Map<String, Value>,
}

/// Keys RabbitMQ writes about the export itself: no setting, so skipped without a word.
const ABOUT_THE_EXPORT: [&str; 4] = [
    "rabbit_version",
    "rabbitmq_version",
    "product_name",
    "product_version",
];

impl Definitions {
    /// Reads a definitions file's text: an error says where its shape is wrong (the
    /// caller names the file).
    pub fn parse(text: &str) -> Result<Definitions, String> {
        serde_json::from_str(text).map_err(|e| format!("not a definitions file: {e}"))
    }

    /// The keys read and not used that hold something, with how many entries each: for
    /// the log.
    pub fn skipped(&self) -> Vec<String> {
        let entries = |v: &Value| match v {
            Value::Array(a) => a.len(),
            Value::Object(o) => o.len(),
            Value::Null => 0,
            _ => 1,
        };
        self.other
            .iter()
            .filter(|(key, value)| !ABOUT_THE_EXPORT.contains(&key.as_str()) && entries(value) > 0)
            .map(|(key, value)| match entries(value) {
                1 => format!("{key} (1 entry)"),
                n => format!("{key} ({n} entries)"),
            })
            .collect()
    }
}

/// User tags as a list or as one string of names separated by commas.
fn tags<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Tags {
        List(Vec<String>),
        Text(String),
    }
    Ok(match Tags::deserialize(d)? {
        Tags::List(list) => list,
        Tags::Text(text) => text
            .split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(String::from)
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What RabbitMQ 3.10's `rabbitmqctl export_definitions` writes for one user, one
    /// extra vhost, a policy, a queue, an exchange and a binding (values shortened).
    const EXPORT: &str = r#"{
      "rabbit_version": "3.10.8",
      "rabbitmq_version": "3.10.8",
      "product_name": "RabbitMQ",
      "product_version": "3.10.8",
      "users": [
        {"name": "app", "password_hash": "kI3GCqW5JLMJa4iX1lo7X4D6XbYqlLgxIs30+P6tENUV2POR",
         "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": ["monitoring"],
         "limits": {}}
      ],
      "vhosts": [{"name": "/"}, {"name": "orders", "limits": [], "metadata": {"description": "", "tags": []}}],
      "permissions": [{"user": "app", "vhost": "orders", "configure": "^app-", "write": ".*", "read": ".*"}],
      "topic_permissions": [],
      "parameters": [],
      "global_parameters": [{"name": "cluster_name", "value": "rabbit@host"}],
      "policies": [{"vhost": "orders", "name": "ha", "pattern": ".*", "apply-to": "queues", "definition": {}, "priority": 0}],
      "queues": [{"name": "app-jobs", "vhost": "orders", "durable": true, "auto_delete": false, "arguments": {"x-queue-type": "classic"}}],
      "exchanges": [{"name": "app-events", "vhost": "orders", "type": "topic", "durable": true, "auto_delete": false, "internal": false, "arguments": {}}],
      "bindings": [{"source": "app-events", "vhost": "orders", "destination": "app-jobs", "destination_type": "queue", "routing_key": "job.#", "arguments": {}}]
    }"#;

    #[test]
    fn a_rabbitmq_export_reads_whole_and_names_what_it_skips() {
        let d = Definitions::parse(EXPORT).unwrap();
        assert_eq!(d.users.len(), 1);
        assert_eq!(d.users[0].tags, ["monitoring"]);
        assert_eq!(d.vhosts.len(), 2);
        assert_eq!(d.permissions[0].configure, "^app-");
        assert_eq!(d.queues[0].name, "app-jobs");
        assert_eq!(d.exchanges[0].kind, "topic");
        assert_eq!(d.bindings[0].routing_key, "job.#");
        assert_eq!(
            d.skipped(),
            ["global_parameters (1 entry)", "policies (1 entry)"]
        );
    }

    #[test]
    fn tags_written_as_one_string_are_split() {
        let d = Definitions::parse(
            r#"{"users": [{"name": "a", "password_hash": "", "tags": "administrator, monitoring"},
                          {"name": "b", "password_hash": "", "tags": ""}]}"#,
        )
        .unwrap();
        assert_eq!(d.users[0].tags, ["administrator", "monitoring"]);
        assert!(d.users[1].tags.is_empty());
    }

    #[test]
    fn a_file_of_the_wrong_shape_says_where() {
        for (text, says) in [
            ("", "EOF"),
            ("[]", "expected struct"),
            (
                r#"{"users": [{"password_hash": ""}]}"#,
                "missing field `name`",
            ),
            (
                r#"{"permissions": [{"user": "a", "vhost": "/"}]}"#,
                "missing field",
            ),
            (r#"{"users": {"name": "a"}}"#, "expected a sequence"),
        ] {
            let e = Definitions::parse(text).unwrap_err();
            assert!(e.contains(says), "{text}: {e}");
        }
    }
}
