//! `--queue-arg KEY=VALUE`: entries for the arguments table of every `queue.declare` an
//! AMQP run makes, such as `x-queue-type=quorum` for RabbitMQ's replicated queues.
//!
//! The value's AMQP type follows from its text: a whole number is a signed 64-bit integer
//! (long-long, the type RabbitMQ reads `x-max-length` and its kin as), `true` and `false`
//! a boolean, anything else a long string.

use std::fmt;

use amq_protocol::types::{AMQPValue, FieldTable, LongString, ShortString};
use serde_json::json;

/// The longest key an AMQP field table takes (a short string).
const MAX_KEY_BYTES: usize = 255;

/// One `--queue-arg`: a key and its typed value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueArg {
    pub key: String,
    pub value: QueueArgValue,
}

/// A `--queue-arg` value, typed as it goes on the wire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QueueArgValue {
    /// A long-long integer (`l`).
    Int(i64),
    /// A boolean (`t`).
    Bool(bool),
    /// A long string (`S`).
    Text(String),
}

impl fmt::Display for QueueArg {
    /// As `--queue-arg` reads it back: "x-queue-type=quorum", "x-max-length=1000".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.value {
            QueueArgValue::Int(n) => write!(f, "{}={n}", self.key),
            QueueArgValue::Bool(b) => write!(f, "{}={b}", self.key),
            QueueArgValue::Text(s) => write!(f, "{}={s}", self.key),
        }
    }
}

/// Parses `--queue-arg`: KEY=VALUE, split at the first `=`; the key is not empty and fits
/// a short string (255 bytes).
///
/// # Errors
///
/// No `=`, an empty or too long key, or a whole number outside the signed 64-bit range.
pub fn parse_queue_arg(text: &str) -> Result<QueueArg, String> {
    let Some((key, value)) = text.split_once('=') else {
        return Err(format!(
            "{text:?}: write KEY=VALUE, e.g. x-queue-type=quorum or x-max-length=10000"
        ));
    };
    if key.is_empty() {
        return Err(format!("{text:?}: the key before `=` is empty"));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(format!(
            "{text:?}: the key is {} bytes long; AMQP takes at most {MAX_KEY_BYTES}",
            key.len()
        ));
    }
    Ok(QueueArg {
        key: key.to_string(),
        value: parse_value(text, value)?,
    })
}

/// The typed value of `--queue-arg` `text`.
fn parse_value(text: &str, value: &str) -> Result<QueueArgValue, String> {
    match value {
        "true" => return Ok(QueueArgValue::Bool(true)),
        "false" => return Ok(QueueArgValue::Bool(false)),
        _ => {}
    }
    let digits = value.strip_prefix(['-', '+']).unwrap_or(value);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Ok(QueueArgValue::Text(value.to_string()));
    }
    value.parse().map(QueueArgValue::Int).map_err(|_| {
        format!("{text:?}: {value} is outside the signed 64-bit range an AMQP integer takes")
    })
}

/// A key given more than once, which the arguments table could hold only once.
pub fn repeated_key(args: &[QueueArg]) -> Option<&str> {
    args.iter()
        .enumerate()
        .find(|(i, a)| args[..*i].iter().any(|b| b.key == a.key))
        .map(|(_, a)| a.key.as_str())
}

/// The arguments table of a `queue.declare`.
pub fn field_table(args: &[QueueArg]) -> FieldTable {
    let mut table = FieldTable::default();
    for a in args {
        let value = match &a.value {
            QueueArgValue::Int(n) => AMQPValue::LongLongInt(*n),
            QueueArgValue::Bool(b) => AMQPValue::Boolean(*b),
            QueueArgValue::Text(s) => AMQPValue::LongString(LongString::from(s.as_str())),
        };
        let key = ShortString::try_new(a.key.as_str()).expect("the parser bounds the key");
        table.insert(key, value);
    }
    table
}

/// The arguments as a JSON object, for `summary.json`.
pub fn to_json(args: &[QueueArg]) -> serde_json::Value {
    let entries = args.iter().map(|a| {
        let value = match &a.value {
            QueueArgValue::Int(n) => json!(n),
            QueueArgValue::Bool(b) => json!(b),
            QueueArgValue::Text(s) => json!(s),
        };
        (a.key.clone(), value)
    });
    serde_json::Value::Object(entries.collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arg(key: &str, value: QueueArgValue) -> QueueArg {
        QueueArg {
            key: key.into(),
            value,
        }
    }

    #[test]
    fn values_are_typed_by_their_text() {
        use QueueArgValue::{Bool, Int, Text};
        let cases = [
            (
                "x-queue-type=quorum",
                arg("x-queue-type", Text("quorum".into())),
            ),
            ("x-max-length=10000", arg("x-max-length", Int(10_000))),
            ("x-priority=-3", arg("x-priority", Int(-3))),
            ("x-n=+7", arg("x-n", Int(7))),
            ("x-n=9223372036854775807", arg("x-n", Int(i64::MAX))),
            ("x-n=-9223372036854775808", arg("x-n", Int(i64::MIN))),
            (
                "x-single-active-consumer=true",
                arg("x-single-active-consumer", Bool(true)),
            ),
            ("x-flag=false", arg("x-flag", Bool(false))),
            ("x-flag=True", arg("x-flag", Text("True".into()))),
            ("x-ttl=1.5", arg("x-ttl", Text("1.5".into()))),
            ("x-sign=-", arg("x-sign", Text("-".into()))),
            ("x-empty=", arg("x-empty", Text(String::new()))),
            ("x-eq=a=b", arg("x-eq", Text("a=b".into()))),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_queue_arg(text), Ok(expected), "{text}");
        }
    }

    #[test]
    fn malformed_arguments_are_refused_with_the_reason() {
        let no_equals = parse_queue_arg("x-queue-type").unwrap_err();
        assert!(no_equals.contains("KEY=VALUE"), "{no_equals}");
        let empty_key = parse_queue_arg("=quorum").unwrap_err();
        assert!(empty_key.contains("key before `=` is empty"), "{empty_key}");
        let long_key = parse_queue_arg(&format!("{}=1", "k".repeat(256))).unwrap_err();
        assert!(long_key.contains("at most 255"), "{long_key}");
        assert!(parse_queue_arg(&format!("{}=1", "k".repeat(255))).is_ok());
        let huge = parse_queue_arg("x-n=9223372036854775808").unwrap_err();
        assert!(huge.contains("64-bit"), "{huge}");
    }

    #[test]
    fn arguments_read_back_as_written() {
        for text in ["x-queue-type=quorum", "x-max-length=-1", "x-b=true", "x-e="] {
            assert_eq!(parse_queue_arg(text).unwrap().to_string(), text);
        }
    }

    #[test]
    fn the_table_carries_each_type() {
        let args: Vec<QueueArg> = ["x-queue-type=quorum", "x-max-length=5", "x-sac=true"]
            .iter()
            .map(|t| parse_queue_arg(t).unwrap())
            .collect();
        let table = field_table(&args);
        let inner = table.inner();
        assert_eq!(inner.len(), 3);
        assert_eq!(
            inner.get("x-queue-type"),
            Some(&AMQPValue::LongString("quorum".into()))
        );
        assert_eq!(inner.get("x-max-length"), Some(&AMQPValue::LongLongInt(5)));
        assert_eq!(inner.get("x-sac"), Some(&AMQPValue::Boolean(true)));
        assert_eq!(
            to_json(&args),
            json!({"x-queue-type": "quorum", "x-max-length": 5, "x-sac": true})
        );
        assert_eq!(field_table(&[]), FieldTable::default());
    }

    #[test]
    fn a_repeated_key_is_found() {
        let parse = |texts: &[&str]| -> Vec<QueueArg> {
            texts.iter().map(|t| parse_queue_arg(t).unwrap()).collect()
        };
        assert_eq!(repeated_key(&parse(&["a=1", "b=2"])), None);
        assert_eq!(repeated_key(&parse(&["a=1", "b=2", "a=3"])), Some("a"));
        assert_eq!(repeated_key(&[]), None);
    }
}
