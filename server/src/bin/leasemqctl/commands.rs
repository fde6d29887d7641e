//! Each command as management API calls, and lists printed with `rabbitmqctl`'s columns.

use std::io::{Read as _, Write as _};

use hyper::{Method, StatusCode};
use serde_json::{json, Map, Value};

use crate::client::{segment, Answer, Client};
use crate::{Args, Command, Formatter};

/// `rabbitmqctl list_consumers`' columns.
const CONSUMER_COLUMNS: [&str; 7] = [
    "queue_name",
    "channel_pid",
    "consumer_tag",
    "ack_required",
    "prefetch_count",
    "active",
    "arguments",
];

/// `rabbitmqctl list_bindings`' columns.
const BINDING_COLUMNS: [&str; 6] = [
    "source_name",
    "source_kind",
    "destination_name",
    "destination_kind",
    "routing_key",
    "arguments",
];

/// Runs `args.command`.
pub async fn run(client: &Client, args: &Args) -> Result<(), String> {
    let vhost = segment(&args.vhost);
    match &args.command {
        Command::Ping => {
            ok(client.get("/api/whoami").await?)?;
            println!("Ping succeeded");
            Ok(())
        }
        Command::Status => status(client).await,
        Command::ListQueues { columns } => {
            let items = list(client, &format!("/api/queues/{vhost}")).await?;
            print(args, &items, columns, &["name", "messages"], queue_column)
        }
        Command::ListExchanges { columns } => {
            let items = list(client, &format!("/api/exchanges/{vhost}")).await?;
            print(args, &items, columns, &["name", "type"], same)
        }
        Command::ListBindings { columns } => {
            let items = list(client, &format!("/api/bindings/{vhost}")).await?;
            print(args, &items, columns, &BINDING_COLUMNS, binding_column)
        }
        Command::ListConnections { columns } => {
            let items = list(client, "/api/connections").await?;
            let default = ["user", "peer_host", "peer_port", "state"];
            print(args, &items, columns, &default, connection_column)
        }
        Command::ListChannels { columns } => {
            let items = list(client, "/api/channels").await?;
            let default = ["pid", "user", "consumer_count", "messages_unacknowledged"];
            print(args, &items, columns, &default, channel_column)
        }
        Command::ListConsumers { columns } => {
            let items = list(client, &format!("/api/consumers/{vhost}")).await?;
            print(args, &items, columns, &CONSUMER_COLUMNS, consumer_column)
        }
        Command::ListUsers => {
            let items = list(client, "/api/users").await?;
            print(args, &items, &[], &["user", "tags"], user_column)
        }
        Command::ListPermissions => {
            let items = list(client, &format!("/api/vhosts/{vhost}/permissions")).await?;
            print(
                args,
                &items,
                &[],
                &["user", "configure", "write", "read"],
                same,
            )
        }
        Command::ListVhosts { columns } => {
            let items = list(client, "/api/vhosts").await?;
            print(args, &items, columns, &["name"], same)
        }
        command => change(client, &vhost, command).await,
    }
}

/// The commands that change something.
async fn change(client: &Client, vhost: &str, command: &Command) -> Result<(), String> {
    let answer = match command {
        Command::PurgeQueue { .. }
        | Command::DeleteQueue { .. }
        | Command::CloseConnection { .. } => change_queue(client, vhost, command).await?,
        Command::ExportDefinitions { file } => {
            let definitions = ok(client.get("/api/definitions").await?)?;
            let text = serde_json::to_string_pretty(&definitions).map_err(|e| e.to_string())?;
            return write_out(file, &text);
        }
        Command::ImportDefinitions { file } => {
            let text = read_in(file)?;
            let body: Value =
                serde_json::from_str(&text).map_err(|e| format!("{}: {e}", file.display()))?;
            (client.call(Method::POST, "/api/definitions", Some(&body))).await?
        }
        _ => change_access(client, vhost, command).await?,
    };
    ok(answer).map(|_| ())
}

/// Purges and deletes of queues, and closes of connections.
async fn change_queue(client: &Client, vhost: &str, command: &Command) -> Result<Answer, String> {
    let queue = |name: &str| format!("/api/queues/{vhost}/{}", segment(name));
    match command {
        Command::PurgeQueue { queue: name } => {
            let path = format!("{}/contents", queue(name));
            client.call(Method::DELETE, &path, None).await
        }
        Command::DeleteQueue {
            queue: name,
            if_unused,
            if_empty,
        } => {
            let mut conditions = Vec::new();
            if *if_unused {
                conditions.push("if-unused=true");
            }
            if *if_empty {
                conditions.push("if-empty=true");
            }
            let path = match conditions.is_empty() {
                true => queue(name),
                false => format!("{}?{}", queue(name), conditions.join("&")),
            };
            // What it held, for the line rabbitmqctl prints.
            let held = ok(client.get(&queue(name)).await?)?;
            let answer = client.call(Method::DELETE, &path, None).await?;
            if answer.status.is_success() {
                let ready = held["messages_ready"].as_u64().unwrap_or(0);
                println!("Queue was successfully deleted with {ready} ready messages");
            }
            Ok(answer)
        }
        Command::CloseConnection { connection, reason } => {
            let path = format!("/api/connections/{}", segment(connection));
            client.delete_with_reason(&path, reason).await
        }
        _ => unreachable!("only queue and connection commands come here"),
    }
}

/// Users, permissions and virtual hosts.
async fn change_access(client: &Client, vhost: &str, command: &Command) -> Result<Answer, String> {
    let user = |name: &str| format!("/api/users/{}", segment(name));
    let permissions = |name: &str| format!("/api/permissions/{vhost}/{}", segment(name));
    let vhost_path = |name: &str| format!("/api/vhosts/{}", segment(name));
    let (method, path, body) = match command {
        Command::AddUser { username, password } => {
            // As rabbitmqctl: a user that exists is an error, not a change of password.
            if client.get(&user(username)).await?.status.is_success() {
                return Err(format!("user \"{username}\" already exists"));
            }
            let body = json!({"password": password, "tags": ""});
            (Method::PUT, user(username), Some(body))
        }
        Command::DeleteUser { username } => (Method::DELETE, user(username), None),
        Command::ChangePassword { username, password } => {
            let current = ok(client.get(&user(username)).await?)?;
            let body = json!({"password": password, "tags": current["tags"].clone()});
            (Method::PUT, user(username), Some(body))
        }
        Command::SetUserTags { username, tags } => {
            let current = ok(client.get(&user(username)).await?)?;
            let body = json!({
                "password_hash": current["password_hash"].clone(),
                "hashing_algorithm": current["hashing_algorithm"].clone(),
                "tags": tags.join(","),
            });
            (Method::PUT, user(username), Some(body))
        }
        Command::SetPermissions {
            username,
            conf,
            write,
            read,
        } => {
            let body = json!({"configure": conf, "write": write, "read": read});
            (Method::PUT, permissions(username), Some(body))
        }
        Command::ClearPermissions { username } => (Method::DELETE, permissions(username), None),
        Command::AddVhost { vhost } => (Method::PUT, vhost_path(vhost), Some(json!({}))),
        Command::DeleteVhost { vhost } => (Method::DELETE, vhost_path(vhost), None),
        _ => unreachable!("lists are run by `run`"),
    };
    client.call(method, &path, body.as_ref()).await
}

/// The body of a success; a refusal as an error naming its reason.
fn ok(answer: Answer) -> Result<Value, String> {
    if answer.status.is_success() {
        Ok(answer.body)
    } else if answer.status == StatusCode::NOT_FOUND {
        Err(format!("not found: {}", answer.reason()))
    } else {
        Err(answer.reason())
    }
}

/// A list the API answers at `path`.
async fn list(client: &Client, path: &str) -> Result<Vec<Value>, String> {
    match ok(client.get(path).await?)? {
        Value::Array(items) => Ok(items),
        other => Err(format!("{path}: not a list: {other}")),
    }
}

/// `rabbitmqctl status`, in short.
async fn status(client: &Client) -> Result<(), String> {
    let overview = ok(client.get("/api/overview").await?)?;
    let text = |key: &str| overview[key].as_str().unwrap_or_default().to_string();
    println!("Status of node {}", text("node"));
    println!(
        "Product: {} {}",
        text("product_name"),
        text("product_version")
    );
    println!("Compatible with: RabbitMQ {}", text("rabbitmq_version"));
    println!("Listeners:");
    for l in overview["listeners"].as_array().into_iter().flatten() {
        println!(
            "  port {}, protocol {}",
            l["port"],
            l["protocol"].as_str().unwrap_or_default()
        );
    }
    let alarms = overview["alarms"].as_array().map_or(0, Vec::len);
    println!(
        "Alarms: {}",
        if alarms == 0 {
            "(none)".to_string()
        } else {
            overview["alarms"].to_string()
        }
    );
    let totals = &overview["object_totals"];
    for key in [
        "connections",
        "channels",
        "queues",
        "consumers",
        "exchanges",
    ] {
        println!("Total {key}: {}", totals[key]);
    }
    println!("Messages: {}", overview["queue_totals"]["messages"]);
    Ok(())
}

type Column = fn(&Value, &str) -> Value;

fn same(item: &Value, column: &str) -> Value {
    item.get(column).cloned().unwrap_or(Value::Null)
}

fn queue_column(item: &Value, column: &str) -> Value {
    match column {
        "messages_unacknowledged_ram" | "messages_ram" | "messages_ready_ram" => Value::Null,
        _ => same(item, column),
    }
}

fn binding_column(item: &Value, column: &str) -> Value {
    match column {
        "source_name" => item["source"].clone(),
        "source_kind" => json!("exchange"),
        "destination_name" => item["destination"].clone(),
        "destination_kind" => item["destination_type"].clone(),
        _ => same(item, column),
    }
}

fn consumer_column(item: &Value, column: &str) -> Value {
    match column {
        "queue_name" => item["queue"]["name"].clone(),
        "channel_pid" => item["channel_details"]["name"].clone(),
        "active" => item.get("active").cloned().unwrap_or(json!(true)),
        _ => same(item, column),
    }
}

fn connection_column(item: &Value, column: &str) -> Value {
    match column {
        // What close_connection takes: the connection's name.
        "pid" => item["name"].clone(),
        _ => same(item, column),
    }
}

fn channel_column(item: &Value, column: &str) -> Value {
    match column {
        "pid" => item["name"].clone(),
        _ => same(item, column),
    }
}

fn user_column(item: &Value, column: &str) -> Value {
    match column {
        "user" => item["name"].clone(),
        _ => same(item, column),
    }
}

/// Prints `items` with `columns` (or `default`), each read by `column`.
fn print(
    args: &Args,
    items: &[Value],
    columns: &[String],
    default: &[&str],
    column: Column,
) -> Result<(), String> {
    let columns: Vec<&str> = match columns.is_empty() {
        true => default.to_vec(),
        false => columns.iter().map(String::as_str).collect(),
    };
    let mut out = std::io::stdout().lock();
    let written = match args.formatter {
        // As rabbitmqctl: one object a line, an empty list `[` and `]`.
        Formatter::Json => {
            let rows: Vec<String> = (items.iter())
                .map(|item| {
                    let row: Map<String, Value> = (columns.iter())
                        .map(|c| (c.to_string(), column(item, c)))
                        .collect();
                    Value::Object(row).to_string()
                })
                .collect();
            match rows.is_empty() {
                true => writeln!(out, "[\n]"),
                false => writeln!(out, "[\n{}\n]", rows.join("\n,")),
            }
        }
        // As rabbitmqctl: a header and a row each, and nothing at all for an empty list.
        Formatter::Table if items.is_empty() => Ok(()),
        Formatter::Table => {
            let mut text = String::new();
            if !args.no_table_headers {
                text.push_str(&columns.join("\t"));
                text.push('\n');
            }
            for item in items {
                let row: Vec<String> = (columns.iter()).map(|c| cell(&column(item, c))).collect();
                text.push_str(&row.join("\t"));
                text.push('\n');
            }
            out.write_all(text.as_bytes())
        }
    };
    written.map_err(|e| e.to_string())
}

/// One value as a table cell, as `rabbitmqctl` prints it: text as is, lists in brackets.
fn cell(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(cell).collect();
            format!("[{}]", items.join(", "))
        }
        Value::Object(map) if map.is_empty() => "[]".to_string(),
        other => other.to_string(),
    }
}

fn write_out(file: &std::path::Path, text: &str) -> Result<(), String> {
    if file.as_os_str() == "-" {
        println!("{text}");
        return Ok(());
    }
    std::fs::write(file, text).map_err(|e| format!("{}: {e}", file.display()))
}

fn read_in(file: &std::path::Path) -> Result<String, String> {
    if file.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| e.to_string())?;
        return Ok(text);
    }
    std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))
}
