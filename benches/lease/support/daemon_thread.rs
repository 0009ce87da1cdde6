//! The daemon as `tollgate serve` runs it: on a runtime of its own, `worker_threads` of them
//! (by default half the CPUs: one, a current-thread runtime, on this two-core machine), apart
//! from the benchmark clients' runtime. In a deployment the daemon is another process; sharing
//! the clients' workers would have it pay their scheduling and they its. On its own thread its CPU
//! time can also be read apart from the clients' (`/proc/self/task/<tid>/stat`).

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;

use tollgate::config::Config;
use tollgate::Daemon;

/// A daemon serving on its own thread until [`DaemonThread::stop`].
pub struct DaemonThread {
    http: PathBuf,
    resp: PathBuf,
    /// The thread's id when a current-thread runtime does all the daemon's async work there.
    tid: Option<u32>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl DaemonThread {
    pub fn start(config: Config) -> DaemonThread {
        let (started, ready) = mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("bench-daemon".into())
            .spawn(move || {
                let workers = config.worker_threads();
                let runtime = config.async_runtime().expect("the daemon's runtime");
                runtime.block_on(async move {
                    let daemon = Daemon::start(config).await.expect("daemon starts");
                    let tid = std::fs::read_link("/proc/thread-self")
                        .ok()
                        .and_then(|link| link.file_name()?.to_str()?.parse().ok())
                        .filter(|_| workers == 1);
                    let sockets = (
                        daemon.http_socket().to_owned(),
                        daemon.resp_socket().to_owned(),
                        tid,
                    );
                    started
                        .send(sockets)
                        .expect("the bench waits for the daemon");
                    let _ = stopped.await;
                    daemon.shutdown().await;
                });
            })
            .expect("the daemon's thread");
        let (http, resp, tid) = ready.recv().expect("the daemon started");
        DaemonThread {
            http,
            resp,
            tid,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    pub fn http_socket(&self) -> &Path {
        &self.http
    }

    pub fn resp_socket(&self) -> &Path {
        &self.resp
    }

    /// The `/proc` stat file of the thread that does all the daemon's async work (`None` when
    /// its runtime has several workers).
    pub fn stat_file(&self) -> Option<PathBuf> {
        let tid = self.tid?;
        Some(PathBuf::from(format!("/proc/self/task/{tid}/stat")))
    }

    /// Shuts the daemon down and waits for its thread.
    pub fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            thread.join().expect("the daemon's thread ends");
        }
    }
}
