//! `delay-relay`: a Unix-socket relay that delays every chunk of bytes by a fixed time, each way —
//! a simulated network hop between a proxy and Redis on one machine.
//!
//! It exists for `benches/cache.py --hop-us N` (issue 29: a cached GET against a direct GET with
//! Redis behind a network hop). The usual tool, `tc qdisc add … netem delay 0.5ms` on one side of
//! a veth pair, is not available: this machine's kernel has no netem qdisc ("Specified qdisc kind
//! is unknown"). A relay in a scripting language would spend more CPU per chunk than the delay it
//! adds, hence this one.
//!
//! ```text
//! delay-relay --listen <unix socket> --upstream <unix socket> --delay-us <N> [--spin-us <S>]
//! ```
//!
//! Each accepted connection gets a connection of its own to `--upstream`. Each direction is a
//! reader thread and a writer thread: the reader stamps every chunk with the instant it was read
//! and queues it; the writer sleeps until that instant plus N µs and writes it. So N is a one-way
//! delay (N = 250 adds 0.5 ms to a round trip, as netem's 0.5 ms on one side of a veth pair does),
//! byte order is kept, and a pipeline is delayed, not serialised: chunk k is written at
//! read_time(k) + N, whatever came before it. Nothing limits throughput (the queue is unbounded;
//! what it holds is what arrived in the last N µs).
//!
//! Timing: tokio's timer has a 1 ms granularity, far too coarse for 250 µs, so the writers are OS
//! threads that block in `nanosleep` with the process's timer slack set to 1 ns (Linux's default
//! slack, 50 µs, would be added to every wake-up). `--spin-us S` spins the last S µs of each wait
//! instead of sleeping them — more accurate on a busy machine, at a CPU cost; the default is 0.
//!
//! A side that closes its write half has that FIN delivered (after the bytes before it, delayed
//! like them) to the other side; a read or write error shuts both sockets of that connection down.
//! Errors end the connection, never the relay.

use std::io::{ErrorKind, Read, Write};
use std::net::Shutdown;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use clap::Parser;

/// Bytes one read may take; a larger chunk is read as several, each delayed alike.
const READ_BUFFER: usize = 64 * 1024;
/// The relay's threads only copy bytes: a small stack keeps thousands of connections cheap.
const THREAD_STACK: usize = 128 * 1024;

#[derive(Parser, Debug)]
#[command(about = "Relays a Unix socket to another, delaying every chunk by --delay-us each way")]
struct Args {
    /// The Unix socket to listen on (an old socket file there is replaced).
    #[arg(long)]
    listen: PathBuf,
    /// The Unix socket each accepted connection is relayed to.
    #[arg(long)]
    upstream: PathBuf,
    /// One-way delay of every chunk, each direction, in microseconds.
    #[arg(long)]
    delay_us: u64,
    /// Spin (rather than sleep) the last this many microseconds of each wait.
    #[arg(long, default_value_t = 0)]
    spin_us: u64,
}

/// How long each chunk is held, and how much of that wait is spun.
#[derive(Clone, Copy, Debug)]
struct Delay {
    delay: Duration,
    spin: Duration,
}

fn main() -> ExitCode {
    let args = Args::parse();
    set_timer_slack();
    match std::fs::symlink_metadata(&args.listen) {
        Ok(meta) if meta.file_type().is_socket() => {
            let _ = std::fs::remove_file(&args.listen);
        }
        Ok(_) => {
            eprintln!(
                "delay-relay: {} exists and is not a socket",
                args.listen.display()
            );
            return ExitCode::FAILURE;
        }
        Err(_) => {}
    }
    let listener = match UnixListener::bind(&args.listen) {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!(
                "delay-relay: cannot listen on {}: {error}",
                args.listen.display()
            );
            return ExitCode::FAILURE;
        }
    };
    let delay = Delay {
        delay: Duration::from_micros(args.delay_us),
        spin: Duration::from_micros(args.spin_us),
    };
    serve(listener, &args.upstream, delay)
}

/// Linux adds up to the thread's timer slack (50 µs by default) to every sleep; 1 ns makes a
/// 250 µs sleep end when asked. Threads inherit it, so it is set before any is started.
fn set_timer_slack() {
    // SAFETY: PR_SET_TIMERSLACK takes an integer and touches only the calling thread's slack.
    let rc = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
    if rc != 0 {
        eprintln!(
            "delay-relay: PR_SET_TIMERSLACK failed ({}); sleeps may overshoot by up to 50 µs",
            std::io::Error::last_os_error()
        );
    }
}

/// Accepts connections for ever, each relayed on threads of its own.
fn serve(listener: UnixListener, upstream: &Path, delay: Delay) -> ! {
    loop {
        match listener.accept() {
            Ok((client, _)) => {
                let upstream = upstream.to_path_buf();
                if let Err(error) =
                    spawn("delay-relay-conn", move || relay(client, &upstream, delay))
                {
                    eprintln!("delay-relay: cannot start a connection's thread: {error}");
                }
            }
            Err(error) => {
                // EMFILE and the like: wait a little rather than spin on accept.
                eprintln!("delay-relay: accept: {error}");
                thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

fn spawn<F: FnOnce() + Send + 'static>(
    name: &str,
    body: F,
) -> std::io::Result<thread::JoinHandle<()>> {
    thread::Builder::new()
        .name(name.to_string())
        .stack_size(THREAD_STACK)
        .spawn(body)
}

/// One client connection: a connection to upstream, and the two directions between them.
fn relay(client: UnixStream, upstream: &Path, delay: Delay) {
    let server = match UnixStream::connect(upstream) {
        Ok(server) => server,
        Err(error) => {
            eprintln!(
                "delay-relay: cannot connect to {}: {error}",
                upstream.display()
            );
            return;
        }
    };
    let run = || -> std::io::Result<()> {
        let up = direction(client.try_clone()?, server.try_clone()?, delay)?;
        let down = direction(server.try_clone()?, client.try_clone()?, delay)?;
        for handle in up.into_iter().chain(down) {
            let _ = handle.join();
        }
        Ok(())
    };
    if let Err(error) = run() {
        eprintln!("delay-relay: connection set-up: {error}");
        abort(&client, &server);
    }
}

/// Starts `from` → `to`: a reader thread stamping chunks, a writer thread delivering them late.
fn direction(
    from: UnixStream,
    to: UnixStream,
    delay: Delay,
) -> std::io::Result<[thread::JoinHandle<()>; 2]> {
    let (queue, chunks) = mpsc::channel::<(Instant, Vec<u8>)>();
    let (reader_from, reader_to) = (from.try_clone()?, to.try_clone()?);
    let writer = spawn("delay-relay-write", move || {
        for (due, chunk) in chunks {
            sleep_until(due, delay.spin);
            if (&to).write_all(&chunk).is_err() {
                abort(&from, &to);
                return;
            }
        }
        // The reader saw end of file (or failed): pass the close on, after every byte before it.
        let _ = to.shutdown(Shutdown::Write);
    })?;
    let reader = spawn("delay-relay-read", move || {
        let mut buffer = vec![0u8; READ_BUFFER];
        loop {
            match (&reader_from).read(&mut buffer) {
                Ok(0) => break,
                Ok(read) => {
                    let due = Instant::now() + delay.delay;
                    if queue.send((due, buffer[..read].to_vec())).is_err() {
                        break; // the writer failed and has shut everything down
                    }
                }
                Err(error) if error.kind() == ErrorKind::Interrupted => continue,
                Err(_) => {
                    abort(&reader_from, &reader_to);
                    break;
                }
            }
        }
    });
    match reader {
        Ok(reader) => Ok([reader, writer]),
        Err(error) => Err(error), // the writer ends when `queue` is dropped with the closure
    }
}

/// Ends a connection: every blocked read or write on either socket returns.
fn abort(a: &UnixStream, b: &UnixStream) {
    let _ = a.shutdown(Shutdown::Both);
    let _ = b.shutdown(Shutdown::Both);
}

/// Sleeps until `due`, spinning its last `spin`.
fn sleep_until(due: Instant, spin: Duration) {
    loop {
        let now = Instant::now();
        if now >= due {
            return;
        }
        let left = due - now;
        if left > spin {
            thread::sleep(left - spin);
        } else {
            std::hint::spin_loop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on `path`: every connection gets its bytes back, and its close.
    fn echo_server(path: &Path) {
        let listener = UnixListener::bind(path).unwrap();
        thread::spawn(move || {
            for stream in listener.incoming() {
                let mut stream = stream.unwrap();
                thread::spawn(move || {
                    let mut buffer = [0u8; 4096];
                    loop {
                        match stream.read(&mut buffer) {
                            Ok(0) | Err(_) => return,
                            Ok(read) => stream.write_all(&buffer[..read]).unwrap(),
                        }
                    }
                });
            }
        });
    }

    /// An echo server behind a relay delaying `delay`; returns the relay's socket.
    fn relayed_echo(dir: &Path, delay: Duration) -> PathBuf {
        set_timer_slack();
        let (echo, relay) = (dir.join("echo.sock"), dir.join("relay.sock"));
        echo_server(&echo);
        let listener = UnixListener::bind(&relay).unwrap();
        let delay = Delay {
            delay,
            spin: Duration::ZERO,
        };
        thread::spawn(move || serve(listener, &echo, delay));
        relay
    }

    fn read_exactly(stream: &mut UnixStream, len: usize) -> Vec<u8> {
        let mut got = vec![0u8; len];
        stream.read_exact(&mut got).unwrap();
        got
    }

    #[test]
    fn bytes_arrive_intact_in_order_and_a_round_trip_takes_twice_the_delay() {
        let dir = tempfile::tempdir().unwrap();
        let delay = Duration::from_millis(20);
        let mut client = UnixStream::connect(relayed_echo(dir.path(), delay)).unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();

        for round in 0..3u8 {
            let message = vec![b'a' + round; 10];
            let started = Instant::now();
            client.write_all(&message).unwrap();
            assert_eq!(read_exactly(&mut client, message.len()), message);
            let took = started.elapsed();
            assert!(took >= 2 * delay, "round trip {took:?} < 2 × {delay:?}");
            assert!(
                took < 2 * delay + Duration::from_millis(200),
                "round trip {took:?}"
            );
        }

        // Larger than one read: several chunks, reassembled in order.
        let big: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
        let writer = {
            let mut client = client.try_clone().unwrap();
            let big = big.clone();
            thread::spawn(move || client.write_all(&big).unwrap())
        };
        assert_eq!(read_exactly(&mut client, big.len()), big);
        writer.join().unwrap();

        // Closing our side reaches the echo server, whose close comes back.
        client.shutdown(Shutdown::Write).unwrap();
        let mut rest = Vec::new();
        client.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty());
    }

    #[test]
    fn a_pipeline_is_delayed_not_serialised() {
        let dir = tempfile::tempdir().unwrap();
        let delay = Duration::from_millis(50);
        let mut client = UnixStream::connect(relayed_echo(dir.path(), delay)).unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();

        // 20 chunks 2 ms apart: serialised, they would take 20 × 100 ms; delayed, ~140 ms.
        let started = Instant::now();
        for index in 0..20u8 {
            client.write_all(&[index; 3]).unwrap();
            thread::sleep(Duration::from_millis(2));
        }
        let got = read_exactly(&mut client, 60);
        let took = started.elapsed();
        let expected: Vec<u8> = (0..20u8).flat_map(|index| [index; 3]).collect();
        assert_eq!(got, expected);
        assert!(took >= 2 * delay, "{took:?}");
        assert!(
            took < Duration::from_millis(600),
            "the pipeline took {took:?}"
        );
    }

    #[test]
    fn an_unreachable_upstream_ends_the_connection_not_the_relay() {
        let dir = tempfile::tempdir().unwrap();
        let relay = dir.path().join("relay.sock");
        let listener = UnixListener::bind(&relay).unwrap();
        let missing = dir.path().join("nobody.sock");
        let delay = Delay {
            delay: Duration::from_millis(1),
            spin: Duration::ZERO,
        };
        thread::spawn(move || serve(listener, &missing, delay));
        for _ in 0..2 {
            let mut client = UnixStream::connect(&relay).unwrap();
            client
                .set_read_timeout(Some(Duration::from_secs(5)))
                .unwrap();
            let mut rest = Vec::new();
            assert_eq!(client.read_to_end(&mut rest).unwrap(), 0);
        }
    }
}
