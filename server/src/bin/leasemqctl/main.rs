//! leasemqctl: leasemqd's command line, over its management API (`--management`), with
//! `rabbitmqctl`'s command names and columns (contract §11).
//!
//! ```text
//! leasemqctl --url http://127.0.0.1:15672 --user admin list_queues name messages consumers
//! LEASEMQCTL_PASSWORD=… leasemqctl ping
//! ```
//!
//! The password comes from `LEASEMQCTL_PASSWORD`, else a prompt. Lists print a header and
//! one tab-separated row per item, or with `--formatter json` a JSON array of objects
//! keyed by column. `ping` exits 0 when the node answers: a container's health check.

mod client;
mod commands;

use std::io::{BufRead as _, IsTerminal as _, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use client::Client;

/// leasemqd's command line, over its management API.
#[derive(Debug, Parser)]
#[command(version, about)]
pub struct Args {
    /// The management API's address (leasemqd --management).
    #[arg(long, global = true, default_value = "http://127.0.0.1:15672")]
    url: String,
    /// The user to ask as (its password: LEASEMQCTL_PASSWORD, else a prompt).
    #[arg(long, global = true, default_value = "guest")]
    user: String,
    /// The CA certificate an https:// URL is checked against.
    #[arg(long, global = true, value_name = "FILE")]
    cacert: Option<PathBuf>,
    /// How lists are printed.
    #[arg(long, global = true, value_enum, default_value = "table")]
    formatter: Formatter,
    /// The virtual host.
    #[arg(short = 'p', long = "vhost", global = true, default_value = "/")]
    vhost: String,
    /// Prints only what was asked for (the default here: kept for rabbitmqctl's scripts).
    #[arg(short = 'q', long, global = true)]
    quiet: bool,
    /// Leaves out the header line of a list.
    #[arg(long, global = true)]
    no_table_headers: bool,
    #[command(subcommand)]
    command: Command,
}

/// How a list is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Formatter {
    /// A header, then one tab-separated row per item.
    Table,
    /// A JSON array of objects keyed by column.
    Json,
}

/// What to do, by `rabbitmqctl`'s names.
#[derive(Debug, Subcommand)]
#[command(rename_all = "snake_case")]
pub enum Command {
    /// Exits 0 when the node serves.
    Ping,
    /// The node's version, listeners, alarms and totals.
    Status,
    /// Queues of the virtual host (columns: name messages, by default).
    ListQueues { columns: Vec<String> },
    /// Exchanges of the virtual host (name type).
    ListExchanges { columns: Vec<String> },
    /// Bindings of the virtual host.
    ListBindings { columns: Vec<String> },
    /// Connections (user peer_host peer_port state).
    ListConnections { columns: Vec<String> },
    /// Consumers of the virtual host.
    ListConsumers { columns: Vec<String> },
    /// Channels.
    ListChannels { columns: Vec<String> },
    /// Users and their tags.
    ListUsers,
    /// Permissions in the virtual host.
    ListPermissions,
    /// Virtual hosts.
    ListVhosts { columns: Vec<String> },
    /// Removes a queue's ready messages.
    PurgeQueue { queue: String },
    /// Deletes a queue.
    DeleteQueue {
        queue: String,
        /// Only if it has no consumers.
        #[arg(short = 'u', long)]
        if_unused: bool,
        /// Only if it holds no messages.
        #[arg(short = 'e', long)]
        if_empty: bool,
    },
    /// Closes a connection (by the name list_connections name shows) with 320.
    CloseConnection { connection: String, reason: String },
    /// Adds a user with no tags and no permissions.
    AddUser { username: String, password: String },
    /// Deletes a user.
    DeleteUser { username: String },
    /// Changes a user's password.
    ChangePassword { username: String, password: String },
    /// Sets a user's tags (none: no tags).
    SetUserTags { username: String, tags: Vec<String> },
    /// Sets a user's permissions in the virtual host.
    SetPermissions {
        username: String,
        conf: String,
        write: String,
        read: String,
    },
    /// Clears a user's permissions in the virtual host.
    ClearPermissions { username: String },
    /// Adds a virtual host.
    AddVhost { vhost: String },
    /// Deletes a virtual host, with its queues and exchanges.
    DeleteVhost { vhost: String },
    /// Writes the definitions (users, vhosts, permissions, queues, exchanges, bindings)
    /// to FILE (`-`: standard output).
    ExportDefinitions { file: PathBuf },
    /// Imports definitions from FILE (`-`: standard input).
    ImportDefinitions { file: PathBuf },
}

fn main() -> ExitCode {
    let args = Args::parse();
    let password = match password(&args.user) {
        Ok(password) => password,
        Err(e) => {
            eprintln!("leasemqctl: {e}");
            return ExitCode::from(2);
        }
    };
    let client = match Client::new(&args.url, &args.user, &password, args.cacert.as_deref()) {
        Ok(client) => client,
        Err(e) => {
            eprintln!("leasemqctl: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime starts");
    match runtime.block_on(commands::run(&client, &args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {e}");
            // rabbitmqctl's code for a node it cannot reach or that refused the command.
            ExitCode::from(69)
        }
    }
}

/// The password: `LEASEMQCTL_PASSWORD`, else asked on the terminal (not echoed).
fn password(user: &str) -> Result<String, String> {
    if let Ok(password) = std::env::var("LEASEMQCTL_PASSWORD") {
        return Ok(password);
    }
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        return Err("set LEASEMQCTL_PASSWORD, or run on a terminal to be asked".into());
    }
    eprint!("Password for {user}: ");
    let _ = std::io::stderr().flush();
    let echo = Echo::off(&stdin);
    let mut line = String::new();
    stdin
        .lock()
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    drop(echo);
    eprintln!();
    Ok(line.trim_end_matches(['\r', '\n']).to_string())
}

/// The terminal's echo turned off while this lives.
struct Echo(Option<rustix::termios::Termios>);

impl Echo {
    fn off(stdin: &std::io::Stdin) -> Echo {
        use rustix::termios::{tcgetattr, tcsetattr, LocalModes, OptionalActions};
        let Ok(before) = tcgetattr(stdin) else {
            return Echo(None);
        };
        let mut quiet = before.clone();
        quiet.local_modes.remove(LocalModes::ECHO);
        match tcsetattr(stdin, OptionalActions::Now, &quiet) {
            Ok(()) => Echo(Some(before)),
            Err(_) => Echo(None),
        }
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        if let Some(before) = &self.0 {
            let _ = rustix::termios::tcsetattr(
                std::io::stdin(),
                rustix::termios::OptionalActions::Now,
                before,
            );
        }
    }
}
