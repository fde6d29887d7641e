//! Request bodies as RabbitMQ reads them: JSON, where `rabbitmqadmin` writes numbers and
//! booleans as strings (`"durable": "true"`, `"count": "5"`), which are taken as the
//! values they spell.

use axum::body::Bytes;
use serde_json::Value;

use super::reply::ApiError;

/// The body as JSON: an empty body is an empty object; one that does not parse is a 400
/// naming what is wrong.
pub fn json(bytes: &Bytes) -> Result<Value, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Object(serde_json::Map::new()));
    }
    // RabbitMQ's reason for a body that is not a JSON object.
    match serde_json::from_slice(bytes) {
        Ok(value @ Value::Object(_)) => Ok(value),
        _ => Err(ApiError::bad_request("not_json")),
    }
}

/// A boolean field: `true`/`false` or the strings that spell them.
pub fn flag(body: &Value, key: &str) -> Result<Option<bool>, ApiError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(Value::String(s)) if s == "true" => Ok(Some(true)),
        Some(Value::String(s)) if s == "false" => Ok(Some(false)),
        Some(other) => Err(ApiError::bad_request(format!(
            "{key}: not a boolean: {other}"
        ))),
    }
}

/// A whole-number field: a number or a string of digits.
pub fn number(body: &Value, key: &str) -> Result<Option<u64>, ApiError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) if n.as_u64().is_some() => Ok(n.as_u64()),
        Some(Value::String(s)) if s.trim().parse::<u64>().is_ok() => Ok(s.trim().parse().ok()),
        Some(other) => Err(ApiError::bad_request(format!(
            "{key}: not a whole number: {other}"
        ))),
    }
}

/// Refuses a body without each of `keys`, in RabbitMQ's words.
pub fn required(body: &Value, keys: &[&str]) -> Result<(), ApiError> {
    let missing: Vec<String> = (keys.iter())
        .filter(|key| body.get(**key).is_none())
        .map(|key| format!("{{key_missing,{key}}}"))
        .collect();
    match missing.is_empty() {
        true => Ok(()),
        false => Err(ApiError::bad_request(format!("[{}]", missing.join(",")))),
    }
}

/// A text field; a number is taken as the text of its digits.
pub fn text(body: &Value, key: &str) -> Result<Option<String>, ApiError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Number(n)) => Ok(Some(n.to_string())),
        Some(other) => Err(ApiError::bad_request(format!("{key}: not text: {other}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn values_written_as_strings_are_taken_as_rabbitmq_takes_them() {
        let body =
            json!({"durable": "true", "auto_delete": false, "count": "5", "n": 7, "key": 12});
        assert_eq!(flag(&body, "durable").unwrap(), Some(true));
        assert_eq!(flag(&body, "auto_delete").unwrap(), Some(false));
        assert_eq!(flag(&body, "missing").unwrap(), None);
        assert_eq!(number(&body, "count").unwrap(), Some(5));
        assert_eq!(number(&body, "n").unwrap(), Some(7));
        assert_eq!(text(&body, "key").unwrap().as_deref(), Some("12"));
        assert!(flag(&json!({"durable": "yes"}), "durable").is_err());
        assert!(number(&json!({"count": -1}), "count").is_err());
    }

    #[test]
    fn a_body_that_is_not_a_json_object_is_a_bad_request() {
        assert_eq!(json(&Bytes::from_static(b"")).unwrap(), json!({}));
        let err = json(&Bytes::from_static(b"{\"durable\": tru")).unwrap_err();
        assert_eq!(err.status, axum::http::StatusCode::BAD_REQUEST);
        assert_eq!(err.reason, "not_json");
        assert!(json(&Bytes::from_static(b"[1]")).is_err());
    }
}
