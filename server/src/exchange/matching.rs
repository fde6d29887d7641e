//! What a binding matches: a topic pattern against a routing key, a headers binding's
//! arguments against a message's headers (read only if a headers binding asks).

use std::collections::BTreeMap;

use amq_protocol::types::{AMQPValue, FieldTable};
use serde::{Deserialize, Serialize};

use super::{Bindings, Kind};

/// A message's headers, parsed the first time a headers exchange asks for them.
pub(super) enum LazyHeaders<F> {
    Unread(Option<F>),
    Read(Option<FieldTable>),
}

impl<F: FnOnce() -> Option<FieldTable>> LazyHeaders<F> {
    pub(super) fn get(&mut self) -> Option<&FieldTable> {
        if let LazyHeaders::Unread(read) = self {
            let read = read.take().expect("taken only here, once");
            *self = LazyHeaders::Read(read());
        }
        match self {
            LazyHeaders::Read(headers) => headers.as_ref(),
            LazyHeaders::Unread(_) => unreachable!("read above"),
        }
    }
}

/// Calls `found` with each destination of `bindings` (an exchange's, of type `kind`) that
/// a message with routing keys `keys` and `headers` goes to; one that more bindings match
/// may come more than once.
pub(super) fn matching<'a, F: FnOnce() -> Option<FieldTable>>(
    kind: Kind,
    bindings: &'a Bindings,
    keys: &[&str],
    headers: &mut LazyHeaders<F>,
    mut found: impl FnMut(&'a str),
) {
    if bindings.is_empty() {
        return;
    }
    let mut each = |to: &'a BTreeMap<String, bool>| to.keys().for_each(|name| found(name));
    match kind {
        Kind::Direct => keys
            .iter()
            .filter_map(|key| bindings.get(*key))
            .for_each(each),
        Kind::Fanout => bindings.values().for_each(each),
        Kind::Topic => (bindings.iter())
            .filter(|(pattern, _)| keys.iter().any(|key| topic_matches(pattern, key)))
            .for_each(|(_, to)| each(to)),
        Kind::Headers => {
            let headers = headers.get();
            (bindings.iter())
                .filter(|(binding, _)| HeadersBinding::decode(binding).matches(headers))
                .for_each(|(_, to)| each(to));
        }
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

    /// The arguments that make this binding, as JSON (values as the binding compares
    /// them: integers, booleans, text).
    pub fn arguments(&self) -> serde_json::Map<String, serde_json::Value> {
        use serde_json::Value;
        let mut out = serde_json::Map::new();
        let how = if self.any { "any" } else { "all" };
        let with_x = if self.with_x { "-with-x" } else { "" };
        out.insert("x-match".into(), Value::String(format!("{how}{with_x}")));
        for (name, value) in &self.pairs {
            let shown = match value.as_deref().and_then(|v| v.split_once(':')) {
                None => Value::Null,
                Some(("i", n)) => n
                    .parse::<i64>()
                    .map_or(Value::String(n.into()), Value::from),
                Some(("b", b)) => Value::Bool(b == "true"),
                Some((_, text)) => Value::String(text.to_string()),
            };
            out.insert(name.clone(), shown);
        }
        out
    }

    /// The text kept for this binding.
    pub fn encode(&self) -> String {
        serde_json::to_string(self).expect("plain data serialises")
    }

    /// The binding a kept text holds; one that does not parse matches nothing.
    pub(super) fn decode(text: &str) -> HeadersBinding {
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
