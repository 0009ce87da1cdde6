//! The benchmark's etcd: Debian's `etcd` (3.4) started on loopback with a temporary data directory,
//! and its lock service (`v3lock`: etcd's `concurrency.Mutex`, run by the server on the caller's
//! lease) reached through the JSON gateway etcd serves on its client port, over kept-alive HTTP/1.1
//! connections. The gateway rather than a gRPC client: `etcd-client` needs `protoc` and tonic in
//! every build of this crate's tests and lints; the gateway reaches the very same mutex and costs
//! one JSON decode and one in-process gRPC hop per call more, so etcd's figures are an upper bound
//! of what a gRPC client would see. The data directory is on tmpfs when there is one, so that WAL
//! fsyncs cost what the benchmark's Redis (no persistence) pays for durability: nothing.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::Request;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};

use crate::programs::{free_ports, on_path};

/// How long etcd may take to answer its first request.
const STARTUP: Duration = Duration::from_secs(20);
/// The TTL of each benchmark session's lease: longer than the benchmark, so it needs no keep-alive.
const SESSION_TTL_SECS: u64 = 3600;

/// A running etcd, stopped when dropped.
pub struct Etcd {
    child: Child,
    client_port: u16,
    _data: tempfile::TempDir,
}

impl Etcd {
    /// Starts etcd, or says why not and returns `None` (the etcd part of the benchmark is skipped).
    pub fn start() -> Option<Etcd> {
        let Some(binary) = on_path("etcd") else {
            println!(
                "etcd: skipped: no `etcd` binary on PATH (Debian: apt-get install etcd-server)"
            );
            return None;
        };
        let shm = Path::new("/dev/shm");
        let data = match shm.is_dir() {
            true => tempfile::tempdir_in(shm),
            false => tempfile::tempdir(),
        }
        .expect("etcd data directory");
        let [client_port, peer_port] = free_ports();
        let client = format!("http://127.0.0.1:{client_port}");
        let peer = format!("http://127.0.0.1:{peer_port}");
        let log = std::fs::File::create(data.path().join("etcd.log")).expect("etcd log file");
        let child = Command::new(binary)
            .args(["--name", "bench", "--data-dir"])
            .arg(data.path().join("member"))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("bench={peer}")])
            .args(["--logger", "zap", "--log-level", "error"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start etcd");
        Some(Etcd {
            child,
            client_port,
            _data: data,
        })
    }

    /// Waits until etcd answers; its version, for the report.
    pub async fn ready(&self) -> String {
        let deadline = Instant::now() + STARTUP;
        loop {
            if let Ok(mut gateway) = self.connect().await {
                if let Ok(status) = gateway.call("/v3/maintenance/status", json!({})).await {
                    return status["version"].as_str().unwrap_or("?").to_owned();
                }
            }
            assert!(
                Instant::now() < deadline,
                "etcd did not answer within {STARTUP:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// One kept-alive connection to the gateway.
    pub async fn connect(&self) -> Result<Gateway, String> {
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", self.client_port))
            .await
            .map_err(|error| error.to_string())?;
        stream
            .set_nodelay(true)
            .map_err(|error| error.to_string())?;
        let (sender, connection) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|error| error.to_string())?;
        tokio::spawn(connection);
        Ok(Gateway { sender })
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 connection to etcd's gateway: one call at a time, as a gRPC stream would carry it.
pub struct Gateway {
    sender: SendRequest<Full<Bytes>>,
}

impl Gateway {
    async fn call(&mut self, path: &str, body: Value) -> Result<Value, String> {
        let request = Request::post(path)
            .header("host", "127.0.0.1")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .expect("a valid request");
        // Ready once the last exchange has finished on the connection.
        self.sender
            .ready()
            .await
            .map_err(|error| error.to_string())?;
        let response = self
            .sender
            .send_request(request)
            .await
            .map_err(|error| error.to_string())?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|error| error.to_string())?
            .to_bytes();
        let value: Value = serde_json::from_slice(&body).map_err(|error| error.to_string())?;
        match status.is_success() {
            true => Ok(value),
            false => Err(format!("etcd {path}: {status} {value}")),
        }
    }

    /// A session: a lease the session's locks are held under (what `concurrency.NewSession` makes).
    pub async fn session(&mut self) -> Session {
        let granted = self
            .call("/v3/lease/grant", json!({ "TTL": SESSION_TTL_SECS }))
            .await
            .expect("etcd grants a lease");
        Session {
            lease: granted["ID"].clone(),
        }
    }

    /// Takes the mutex `name` (base64, as the gateway carries bytes) under `session`, waiting while
    /// another session holds it; returns the ownership key to unlock with.
    pub async fn lock(&mut self, name: &str, session: &Session) -> Value {
        let locked = self
            .call(
                "/v3/lock/lock",
                json!({ "name": name, "lease": session.lease }),
            )
            .await
            .expect("etcd lock");
        locked["key"].clone()
    }

    pub async fn unlock(&mut self, key: &Value) {
        self.call("/v3/lock/unlock", json!({ "key": key }))
            .await
            .expect("etcd unlock");
    }
}

/// An etcd lease that locks are held under.
pub struct Session {
    lease: Value,
}
