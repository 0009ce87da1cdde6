//! `tollgate status`: one screen about a running daemon, from `GET /v1/status` on its HTTP
//! socket — readiness and why not, Redis, lanes, leases, the policy, budgets and limits. `--json`
//! prints the daemon's answer as it came. Exits 0 when the daemon is ready, 1 when it answers but
//! is not ready, 2 when it cannot be asked.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use serde_json::Value;

use crate::config::Config;

/// The most of an answer read: the status of a daemon is a few KiB.
const MAX_ANSWER: u64 = 1 << 20;
const TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The daemon's HTTP socket; default: the configured one.
    #[arg(long, env = "TOLLGATE_HTTP_SOCKET")]
    socket: Option<PathBuf>,
    /// Print the daemon's JSON answer instead of the screen.
    #[arg(long)]
    json: bool,
}

pub fn run(args: StatusArgs) -> ExitCode {
    let socket = args
        .socket
        .unwrap_or_else(|| Config::default().http_socket());
    let status = match fetch(&socket) {
        Ok(status) => status,
        Err(error) => {
            eprintln!("tollgate status: {}: {error}", socket.display());
            return ExitCode::from(2);
        }
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&status).expect("a JSON value prints")
        );
    } else {
        print!("{}", render(&status));
    }
    if status["ready"] == Value::Bool(true) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `GET /v1/status` over the Unix socket: one HTTP/1.1 request, closed after the answer.
fn fetch(socket: &Path) -> Result<Value, String> {
    let mut stream =
        std::os::unix::net::UnixStream::connect(socket).map_err(|error| error.to_string())?;
    stream
        .set_read_timeout(Some(TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(TIMEOUT)))
        .map_err(|error| error.to_string())?;
    stream
        .write_all(b"GET /v1/status HTTP/1.1\r\nHost: tollgate\r\nConnection: close\r\n\r\n")
        .map_err(|error| error.to_string())?;
    let mut answer = Vec::new();
    stream
        .take(MAX_ANSWER)
        .read_to_end(&mut answer)
        .map_err(|error| error.to_string())?;
    let text = String::from_utf8_lossy(&answer);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or("the daemon's answer has no end of headers")?;
    if !head.starts_with("HTTP/1.1 200") {
        let status = head.lines().next().unwrap_or_default();
        return Err(format!("the daemon answered {status}: {body}"));
    }
    serde_json::from_str(body).map_err(|error| format!("the daemon's answer is not JSON: {error}"))
}

/// The screen: one section a line or a small table, in the order an operator asks.
pub fn render(status: &Value) -> String {
    let mut out = String::new();
    let mut line = |text: String| {
        out.push_str(&text);
        out.push('\n');
    };
    let reasons: Vec<&str> = list(&status["reasons"])
        .iter()
        .filter_map(Value::as_str)
        .collect();
    if status["ready"] == Value::Bool(true) {
        line("tollgate: ready".into());
    } else {
        line("tollgate: NOT READY".into());
        for reason in reasons {
            line(format!("  - {reason}"));
        }
    }

    let redis = &status["redis"];
    let nodes = list(&redis["nodes"]);
    let reachable = nodes.iter().filter(|n| n["reachable"] == true).count();
    line(format!(
        "redis: {} ({reachable} of {} masters reachable)",
        text(&redis["mode"]),
        nodes.len()
    ));
    for node in nodes {
        let answer = match node["reachable"] == true {
            true => format!("redis {}", text(&node["version"])),
            false => format!("unreachable: {}", text(&node["error"])),
        };
        line(format!("  {}: {answer}", text(&node["node"])));
    }

    line(format!("lanes: {}", text(&status["lanes"]["state"])));
    line(format!(
        "  {:<12} {:>5} {:>6} {:>7} {:>7}  {}",
        "lane", "open", "in use", "waiting", "refused", "ceiling"
    ));
    for lane in list(&status["lanes"]["lanes"]) {
        let refused: u64 = lane["rejections"]
            .as_object()
            .map(|counts| counts.values().filter_map(Value::as_u64).sum())
            .unwrap_or(0);
        let ceiling = match lane["max_in_flight"].as_u64() {
            Some(in_flight) => format!(
                "{} connections, {in_flight} in flight",
                text(&lane["max_connections"])
            ),
            None => format!("{} connections", text(&lane["max_connections"])),
        };
        line(format!(
            "  {:<12} {:>5} {:>6} {:>7} {:>7}  {ceiling}{}",
            text(&lane["lane"]).to_uppercase(),
            text(&lane["open"]),
            text(&lane["in_use"]),
            text(&lane["waiting"]),
            refused,
            match lane["unavailable"].as_str() {
                Some(reason) => format!(" (unavailable: {reason})"),
                None => String::new(),
            }
        ));
    }

    let leases = &status["leases"];
    line(format!(
        "leases: {} kept alive by this daemon, {} callers waiting",
        text(&leases["kept"]),
        text(&leases["waiting"])
    ));

    let policy = &status["policy"];
    let files: Vec<String> = list(&policy["files"]).iter().map(text).collect();
    line(format!(
        "policy: generation {}, loaded {}; {} module(s); reloads at least {} apart",
        text(&policy["generation"]),
        text(&policy["loaded_at"]),
        text(&policy["modules"]),
        text(&policy["reload_interval"])
    ));
    for file in files {
        line(format!("  {file}"));
    }

    line("limits:".into());
    if let Some(limits) = status["limits"].as_object() {
        for (name, value) in limits {
            line(format!("  {name:<30} {}", text(value)));
        }
    }
    out
}

fn list(value: &Value) -> &[Value] {
    value.as_array().map(Vec::as_slice).unwrap_or_default()
}

/// A JSON value as text: strings without quotes, anything missing as `?`.
fn text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        Value::Null => "?".to_owned(),
        other => other.to_string(),
    }
}
