//! Messages through the API: `POST …/get` takes or peeks at messages and `POST
//! …/publish` publishes one, each through an internal connection as the caller (so a
//! user's read and write permissions hold, and a publish routes as a client's does).
//! Properties and payloads are written as RabbitMQ's API writes them.

use amq_protocol::frame::{AMQPContentHeader, AMQPFrame};
use amq_protocol::protocol::{basic, confirm, AMQPClass, BasicProperties};
use amq_protocol::types::{FieldTable, ShortString};
use base64::Engine as _;
use serde_json::{json, Map, Value};

use super::body::{flag, number, required, text};
use super::reply::ApiError;
use crate::internal::{Internal, CHANNEL};

/// A `POST …/get` body.
#[derive(Debug)]
pub struct GetRequest {
    /// How many messages, at most.
    pub count: u32,
    /// `ack_requeue_true` (peek), `ack_requeue_false` (take), `reject_requeue_true`,
    /// `reject_requeue_false` (take, dead-lettered).
    pub ackmode: String,
    /// `auto` (text where it is UTF-8, else base64) or `base64`.
    pub encoding: String,
    /// Payloads cut to this many bytes.
    pub truncate: Option<usize>,
}

impl GetRequest {
    /// Reads a body as `rabbitmqadmin` and the console send it.
    pub fn read(body: &Value) -> Result<GetRequest, ApiError> {
        required(body, &["count", "ackmode", "encoding"])?;
        let count = number(body, "count")?.unwrap_or(1);
        let ackmode = text(body, "ackmode")?.unwrap_or_else(|| "ack_requeue_true".into());
        if !matches!(
            ackmode.as_str(),
            "ack_requeue_true"
                | "ack_requeue_false"
                | "reject_requeue_true"
                | "reject_requeue_false"
        ) {
            return Err(ApiError::bad_request(format!(
                "ackmode {ackmode:?} is not known"
            )));
        }
        let encoding = text(body, "encoding")?.unwrap_or_else(|| "auto".into());
        if encoding != "auto" && encoding != "base64" {
            return Err(ApiError::bad_request(
                "Unsupported encoding. Please use auto or base64.",
            ));
        }
        Ok(GetRequest {
            count: u32::try_from(count).unwrap_or(u32::MAX).min(10_000),
            ackmode,
            encoding,
            truncate: number(body, "truncate")?.map(|n| n as usize),
        })
    }
}

/// Takes up to `request.count` messages from `queue` (its client name) and settles them
/// as `request.ackmode` says; each as RabbitMQ's API shows it.
pub fn get(
    conn: &mut Internal,
    queue: &str,
    request: &GetRequest,
) -> Result<Vec<Value>, (u16, String)> {
    let mut taken = Vec::new();
    let mut last_tag = None;
    for _ in 0..request.count {
        let method = AMQPClass::Basic(basic::AMQPMethod::Get(basic::Get {
            queue: queue.into(),
            no_ack: false,
        }));
        let answers = conn.method(method)?;
        let Some((ok, header, payload)) = got(answers) else {
            break;
        };
        last_tag = Some(ok.delivery_tag);
        taken.push(shown(&ok, &header, &payload, request));
    }
    let Some(tag) = last_tag else {
        return Ok(taken);
    };
    let requeue = request.ackmode.ends_with("requeue_true");
    let settle = match request.ackmode.starts_with("ack") && !requeue {
        true => basic::AMQPMethod::Ack(basic::Ack {
            delivery_tag: tag,
            multiple: true,
        }),
        false => basic::AMQPMethod::Nack(basic::Nack {
            delivery_tag: tag,
            multiple: true,
            requeue,
        }),
    };
    conn.method(AMQPClass::Basic(settle))?;
    Ok(taken)
}

/// The get-ok, header and payload among a `basic.get`'s answers; `None` for get-empty.
fn got(answers: Vec<AMQPFrame>) -> Option<(basic::GetOk, AMQPContentHeader, Vec<u8>)> {
    let mut ok = None;
    let mut header = None;
    let mut payload = Vec::new();
    for frame in answers {
        match frame {
            AMQPFrame::Method(_, AMQPClass::Basic(basic::AMQPMethod::GetOk(g))) => ok = Some(g),
            AMQPFrame::Header(_, h) => header = Some(h),
            AMQPFrame::Body(_, bytes) => payload.extend_from_slice(&bytes),
            _ => {}
        }
    }
    Some((ok?, header?, payload))
}

/// One message as RabbitMQ's API shows it.
fn shown(
    ok: &basic::GetOk,
    header: &AMQPContentHeader,
    payload: &[u8],
    request: &GetRequest,
) -> Value {
    let cut = &payload[..request.truncate.unwrap_or(usize::MAX).min(payload.len())];
    let (payload_text, encoding) = match (request.encoding.as_str(), std::str::from_utf8(cut)) {
        ("auto", Ok(text)) => (text.to_string(), "string"),
        _ => (
            base64::engine::general_purpose::STANDARD.encode(cut),
            "base64",
        ),
    };
    json!({
        "payload_bytes": payload.len(),
        "redelivered": ok.redelivered,
        "exchange": ok.exchange.as_str(),
        "routing_key": ok.routing_key.as_str(),
        "message_count": ok.message_count,
        "properties": properties_json(&header.properties),
        "payload": payload_text,
        "payload_encoding": encoding,
    })
}

/// Properties as RabbitMQ's API shows them: only those set.
pub fn properties_json(p: &BasicProperties) -> Value {
    let mut out = Map::new();
    let mut put = |key: &str, value: Option<Value>| {
        if let Some(value) = value {
            out.insert(key.to_string(), value);
        }
    };
    let s = |v: &Option<ShortString>| v.as_ref().map(|s| Value::from(s.as_str()));
    put("content_type", s(p.content_type()));
    put("content_encoding", s(p.content_encoding()));
    put(
        "headers",
        (p.headers().as_ref()).map(|h| Value::Object(crate::field::table_json(h))),
    );
    put("delivery_mode", p.delivery_mode().map(Value::from));
    put("priority", p.priority().map(Value::from));
    put("correlation_id", s(p.correlation_id()));
    put("reply_to", s(p.reply_to()));
    put("expiration", s(p.expiration()));
    put("message_id", s(p.message_id()));
    put("timestamp", p.timestamp().map(Value::from));
    put("type", s(p.kind()));
    put("user_id", s(p.user_id()));
    put("app_id", s(p.app_id()));
    // RabbitMQ shows no properties as an empty list.
    match out.is_empty() {
        true => Value::Array(Vec::new()),
        false => Value::Object(out),
    }
}

/// Properties from RabbitMQ's API's JSON.
pub fn properties_of(json: &Value) -> Result<BasicProperties, ApiError> {
    let mut p = BasicProperties::default();
    let Some(map) = json.as_object() else {
        return Ok(p);
    };
    let short = |key: &str| -> Result<Option<ShortString>, ApiError> {
        Ok(text(json, key)?.map(ShortString::from))
    };
    if let Some(v) = short("content_type")? {
        p = p.with_content_type(v);
    }
    if let Some(v) = short("content_encoding")? {
        p = p.with_content_encoding(v);
    }
    if let Some(Value::Object(headers)) = map.get("headers") {
        p = p.with_headers(crate::imports::table(headers));
    }
    if let Some(n) = number(json, "delivery_mode")? {
        p = p.with_delivery_mode(
            u8::try_from(n).map_err(|_| ApiError::bad_request("delivery_mode is 1 or 2"))?,
        );
    }
    if let Some(n) = number(json, "priority")? {
        p = p.with_priority(
            u8::try_from(n).map_err(|_| ApiError::bad_request("priority is 0 to 255"))?,
        );
    }
    for (key, set) in [
        (
            "correlation_id",
            BasicProperties::with_correlation_id
                as fn(BasicProperties, ShortString) -> BasicProperties,
        ),
        ("reply_to", BasicProperties::with_reply_to),
        ("expiration", BasicProperties::with_expiration),
        ("message_id", BasicProperties::with_message_id),
        ("type", BasicProperties::with_type),
        ("user_id", BasicProperties::with_user_id),
        ("app_id", BasicProperties::with_app_id),
    ] {
        if let Some(v) = short(key)? {
            p = set(p, v);
        }
    }
    if let Some(n) = number(json, "timestamp")? {
        p = p.with_timestamp(n);
    }
    Ok(p)
}

/// A `POST …/publish` body, read.
#[derive(Debug)]
pub struct Publish {
    /// The routing key.
    pub routing_key: String,
    /// The payload's bytes.
    pub payload: Vec<u8>,
    /// Its properties.
    pub properties: BasicProperties,
}

impl Publish {
    /// Reads a body as `rabbitmqadmin` and the console send it.
    pub fn read(body: &Value) -> Result<Publish, ApiError> {
        required(
            body,
            &["properties", "routing_key", "payload", "payload_encoding"],
        )?;
        let routing_key = text(body, "routing_key")?.unwrap_or_default();
        let payload = text(body, "payload")?.unwrap_or_default();
        let encoding = text(body, "payload_encoding")?.unwrap_or_else(|| "string".into());
        let payload = match encoding.as_str() {
            "string" => payload.into_bytes(),
            "base64" => (base64::engine::general_purpose::STANDARD.decode(payload.trim()))
                .map_err(|e| ApiError::bad_request(format!("payload: {e}")))?,
            other => {
                let reason = serde_json::json!(["unsupported_encoding", other]).to_string();
                return Err(ApiError::bad_request(reason));
            }
        };
        let properties = properties_of(body.get("properties").unwrap_or(&Value::Null))?;
        Ok(Publish {
            routing_key,
            payload,
            properties,
        })
    }
}

/// Publishes `message` to `exchange` (its client name) with confirms and `mandatory`:
/// whether it was routed to a queue.
pub fn publish(
    conn: &mut Internal,
    exchange: &str,
    message: &Publish,
) -> Result<bool, (u16, String)> {
    let select = AMQPClass::Confirm(confirm::AMQPMethod::Select(confirm::Select {
        nowait: false,
    }));
    conn.method(select)?;
    let method = AMQPClass::Basic(basic::AMQPMethod::Publish(basic::Publish {
        exchange: exchange.into(),
        routing_key: message.routing_key.as_str().into(),
        mandatory: true,
        immediate: false,
    }));
    let header = AMQPContentHeader {
        class_id: 60,
        body_size: message.payload.len() as u64,
        properties: message.properties.clone(),
    };
    let mut frames = vec![
        AMQPFrame::Method(CHANNEL, method),
        AMQPFrame::Header(CHANNEL, header),
    ];
    // Bodies within the smallest frame_max a connection may have.
    for chunk in message.payload.chunks(4096 - 8) {
        frames.push(AMQPFrame::Body(CHANNEL, chunk.to_vec()));
    }
    let answers = conn.call(&frames).map_err(|e| (541, e))?;
    if let Some(refused) = answers.iter().find_map(crate::internal::refusal) {
        return Err(refused);
    }
    let returned = answers.iter().any(|a| {
        matches!(
            a,
            AMQPFrame::Method(_, AMQPClass::Basic(basic::AMQPMethod::Return(_)))
        )
    });
    Ok(!returned)
}

/// An AMQP argument table from a JSON object, or none.
pub fn arguments(body: &Value) -> Result<FieldTable, ApiError> {
    match body.get("arguments") {
        None | Some(Value::Null) => Ok(FieldTable::default()),
        Some(Value::Object(map)) => Ok(crate::imports::table(map)),
        // rabbitmqadmin may send an empty string for no arguments.
        Some(Value::String(s)) if s.is_empty() => Ok(FieldTable::default()),
        Some(other) => Err(ApiError::bad_request(format!(
            "arguments: not an object: {other}"
        ))),
    }
}

/// Whether a flag of `body` is set: `true` or `"true"`, as rabbitmqadmin sends them.
pub fn is_set(body: &Value, key: &str) -> Result<bool, ApiError> {
    Ok(flag(body, key)?.unwrap_or(false))
}
