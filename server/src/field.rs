//! AMQP field values as RabbitMQ reads them: integers of any width, and the names of
//! value types its error texts use. Shared by the readers of arguments and of properties.

use amq_protocol::types::{AMQPValue, FieldTable};
use serde_json::{Map, Value};

/// An integer of any width, as RabbitMQ compares them.
pub(crate) fn signed(value: &AMQPValue) -> Option<i128> {
    Some(match *value {
        AMQPValue::ShortShortInt(n) => n.into(),
        AMQPValue::ShortShortUInt(n) => n.into(),
        AMQPValue::ShortInt(n) => n.into(),
        AMQPValue::ShortUInt(n) => n.into(),
        AMQPValue::LongInt(n) => n.into(),
        AMQPValue::LongUInt(n) => n.into(),
        AMQPValue::LongLongInt(n) => n.into(),
        _ => return None,
    })
}

/// A field value's type as RabbitMQ names it in its texts.
pub(crate) fn type_name(value: &AMQPValue) -> &'static str {
    match value {
        AMQPValue::Boolean(_) => "bool",
        AMQPValue::ShortShortInt(_) => "byte",
        AMQPValue::ShortShortUInt(_) => "unsignedbyte",
        AMQPValue::ShortInt(_) => "short",
        AMQPValue::ShortUInt(_) => "unsignedshort",
        AMQPValue::LongInt(_) => "signedint",
        AMQPValue::LongUInt(_) => "unsignedint",
        AMQPValue::LongLongInt(_) => "long",
        AMQPValue::Float(_) => "float",
        AMQPValue::Double(_) => "double",
        AMQPValue::DecimalValue(_) => "decimal",
        AMQPValue::ShortString(_) => "shortstr",
        AMQPValue::LongString(_) => "longstr",
        AMQPValue::FieldArray(_) => "array",
        AMQPValue::Timestamp(_) => "timestamp",
        AMQPValue::FieldTable(_) => "table",
        AMQPValue::ByteArray(_) => "binary",
        AMQPValue::Void => "void",
    }
}

/// An AMQP table as JSON, as RabbitMQ's management API shows arguments and headers:
/// numbers as numbers, strings as strings, byte arrays as text where they are UTF-8.
pub fn table_json(table: &FieldTable) -> Map<String, Value> {
    (table.inner().iter())
        .map(|(key, value)| (key.to_string(), value_json(value)))
        .collect()
}

/// One AMQP field value as JSON (see [`table_json`]).
pub fn value_json(value: &AMQPValue) -> Value {
    if let Some(n) = signed(value) {
        return i64::try_from(n).map_or_else(|_| Value::String(n.to_string()), Value::from);
    }
    match value {
        AMQPValue::Boolean(b) => Value::Bool(*b),
        AMQPValue::Float(f) => Value::from(f64::from(*f)),
        AMQPValue::Double(f) => Value::from(*f),
        AMQPValue::DecimalValue(d) => {
            Value::from(f64::from(d.value) / 10f64.powi(i32::from(d.scale)))
        }
        AMQPValue::ShortString(s) => Value::String(s.to_string()),
        AMQPValue::LongString(s) => {
            Value::String(String::from_utf8_lossy(s.as_bytes()).into_owned())
        }
        AMQPValue::ByteArray(b) => {
            Value::String(String::from_utf8_lossy(b.as_slice()).into_owned())
        }
        AMQPValue::FieldArray(items) => {
            Value::Array(items.as_slice().iter().map(value_json).collect())
        }
        AMQPValue::Timestamp(t) => Value::from(*t),
        AMQPValue::FieldTable(t) => Value::Object(table_json(t)),
        AMQPValue::Void => Value::Null,
        _ => Value::Null,
    }
}
