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
//! Each accepted connection gets a connection of its own to `--upstream`, and bytes are forwarded
//! both ways, each chunk written N µs after it was read: N is a one-way delay (N = 250 adds 0.5 ms
//! to a round trip, as netem's 0.5 ms on one side of a veth pair does). Byte order is kept and a
//! pipeline is delayed, not serialised: chunk k is written at read_time(k) + N whatever came before
//! it, and nothing limits throughput (what is queued is what arrived in the last N µs; a peer that
//! reads slowly has its bytes buffered, not the others').
//!
//! One thread, one epoll loop (edge-triggered, non-blocking sockets). Since every chunk waits the
//! same N, chunks fall due in the order they were read, so one FIFO is the whole schedule. The
//! loop waits in `epoll_pwait2` until the head's due time (a nanosecond timeout, with the thread's
//! timer slack set to 1 ns; Linux's default slack would add up to 50 µs): tokio's timer has a 1 ms
//! granularity, far too coarse for 250 µs, and a thread per direction sleeping per chunk (this
//! tool's first version) spent so many context switches that it could not carry 50 unpipelined
//! clients. Under load one wake-up delivers every chunk then due, coalesced per socket.
//! `--spin-us S` wakes S µs early and spins the rest — the wake-up of an idle CPU is then off the
//! delay, at a CPU cost; the default is 0.
//!
//! How late chunks are written is counted: `--stats <file>` and SIGUSR1 write there one line,
//! `late_us` and a histogram of lateness (hand-off to the socket minus due instant) by microsecond,
//! bucket 0 up to bucket 1000 (1 ms or more), counted since the start.
//!
//! A side that closes (end of file) has its close delivered to the other side after the bytes
//! before it, delayed like them; a read or write error closes both sockets of that connection.
//! Errors end the connection, never the relay.

use std::collections::{HashMap, VecDeque};
use std::io::{self, ErrorKind, Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::Parser;

/// Bytes one read may take; a larger chunk is read as several, each delayed alike.
const READ_BUFFER: usize = 64 * 1024;
/// Reads of one socket per turn of the loop before the others get theirs.
const READS_PER_TURN: usize = 16;
const LISTENER: u64 = u64::MAX;
/// Lateness histogram buckets: one per microsecond, the last for 1 ms or more.
const LATE_BUCKETS: usize = 1001;

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
    /// On SIGUSR1, write the histogram of lateness (µs) to this file.
    #[arg(long)]
    stats: Option<PathBuf>,
}

/// How long each chunk is held, and how much of that wait is spun.
#[derive(Clone, Copy, Debug)]
struct Delay {
    delay: Duration,
    spin: Duration,
}

fn main() -> ExitCode {
    let args = Args::parse();
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
    if args.stats.is_some() {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { libc::signal(libc::SIGUSR1, on_sigusr1 as *const () as libc::sighandler_t) };
    }
    match serve(listener, &args.upstream, delay, args.stats) {
        Err(error) => {
            eprintln!("delay-relay: {error}");
            ExitCode::FAILURE
        }
    }
}

static DUMP_STATS: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigusr1(_: libc::c_int) {
    DUMP_STATS.store(true, Ordering::Relaxed);
}

/// Relays every connection `listener` accepts to `upstream`, for ever (an error only if the
/// loop cannot be set up or epoll itself fails).
fn serve(
    listener: UnixListener,
    upstream: &Path,
    delay: Delay,
    stats: Option<PathBuf>,
) -> io::Result<std::convert::Infallible> {
    // Linux adds up to the thread's timer slack (50 µs by default) to a timed wait; 1 ns makes
    // epoll_pwait2 return when asked.
    // SAFETY: PR_SET_TIMERSLACK takes an integer and changes only this thread's slack.
    check(unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) })?;
    listener.set_nonblocking(true)?;
    let epoll = Epoll::new()?;
    epoll.add(listener.as_raw_fd(), LISTENER, libc::EPOLLIN)?;
    let mut relay = Relay {
        epoll,
        listener,
        upstream: upstream.to_path_buf(),
        delay_ns: delay.delay.as_nanos() as u64,
        spin_ns: delay.spin.as_nanos() as u64,
        conns: HashMap::new(),
        next_id: 0,
        queue: VecDeque::new(),
        late_us: vec![0; LATE_BUCKETS],
        stats,
        again: Vec::new(),
        dirty: Vec::new(),
        buffer: vec![0; READ_BUFFER],
    };
    relay.run()
}

/// Nanoseconds of CLOCK_MONOTONIC (the clock of epoll_pwait2's timeout).
fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn check(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

struct Epoll(OwnedFd);

impl Epoll {
    fn new() -> io::Result<Self> {
        // SAFETY: plain syscall; the fd it returns is ours alone.
        let fd = check(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        // SAFETY: `fd` was just opened and is owned by nothing else.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    fn ctl(&self, op: libc::c_int, fd: RawFd, token: u64, events: libc::c_int) -> io::Result<()> {
        let mut event = libc::epoll_event {
            events: events as u32,
            u64: token,
        };
        // SAFETY: `event` is a valid epoll_event; both fds are open.
        check(unsafe { libc::epoll_ctl(self.0.as_raw_fd(), op, fd, &mut event) }).map(|_| ())
    }

    fn add(&self, fd: RawFd, token: u64, events: libc::c_int) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_ADD, fd, token, events)
    }

    fn modify(&self, fd: RawFd, token: u64, events: libc::c_int) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_MOD, fd, token, events)
    }

    /// Waits for events, or `timeout_ns` (none: for ever).
    fn wait(&self, events: &mut [libc::epoll_event], timeout_ns: Option<u64>) -> io::Result<usize> {
        let timeout = timeout_ns.map(|ns| libc::timespec {
            tv_sec: (ns / 1_000_000_000) as libc::time_t,
            tv_nsec: (ns % 1_000_000_000) as libc::c_long,
        });
        let timeout = timeout
            .as_ref()
            .map_or(std::ptr::null(), |t| t as *const libc::timespec);
        // SAFETY: `events` is writable for its whole length; `timeout` is null or a valid timespec.
        let n = unsafe {
            libc::epoll_pwait2(
                self.0.as_raw_fd(),
                events.as_mut_ptr(),
                events.len() as libc::c_int,
                timeout,
                std::ptr::null(),
            )
        };
        if n < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) {
            // A kernel before 5.11 has no epoll_pwait2: millisecond timeouts, rounded up (the
            // delay is then coarse, never short).
            let timeout_ms = timeout_ns.map_or(-1, |ns| {
                ns.div_ceil(1_000_000).min(i32::MAX as u64) as libc::c_int
            });
            // SAFETY: as above.
            let n = unsafe {
                libc::epoll_wait(
                    self.0.as_raw_fd(),
                    events.as_mut_ptr(),
                    events.len() as libc::c_int,
                    timeout_ms,
                )
            };
            return check(n).map(|n| n as usize);
        }
        check(n).map(|n| n as usize)
    }
}

/// One socket of a relayed connection: 0 the client's, 1 upstream's.
struct Side {
    stream: UnixStream,
    /// Bytes due and not yet taken by the socket.
    out: Vec<u8>,
    /// Whether EPOLLOUT is asked for (only while `out` is not empty).
    want_out: bool,
    /// Not yet at end of file.
    reading: bool,
    /// The other side's end of file fell due: shut our writing down once `out` is empty.
    close_after_out: bool,
    shut: bool,
}

struct Conn {
    sides: [Side; 2],
}

/// Bytes read from one side, to be written to the other (`None`: its end of file).
struct Chunk {
    due: u64,
    conn: u64,
    to: usize,
    bytes: Option<Vec<u8>>,
}

struct Relay {
    epoll: Epoll,
    listener: UnixListener,
    upstream: PathBuf,
    delay_ns: u64,
    spin_ns: u64,
    /// Ids are never reused, so a chunk or event of a closed connection finds nothing.
    conns: HashMap<u64, Conn>,
    next_id: u64,
    /// Every chunk in flight, in the order read — which, with one delay for all, is the order due.
    queue: VecDeque<Chunk>,
    /// Chunks written by how late they were, in µs (`--stats`).
    late_us: Vec<u64>,
    stats: Option<PathBuf>,
    /// Sockets left readable after READS_PER_TURN reads (edge-triggered: no new event will come).
    again: Vec<u64>,
    /// (connection, side) given bytes this turn, to be written once each.
    dirty: Vec<(u64, usize)>,
    buffer: Vec<u8>,
}

const READ_EVENTS: libc::c_int = libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLET;

impl Relay {
    fn run(&mut self) -> io::Result<std::convert::Infallible> {
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
        loop {
            self.deliver_due();
            if DUMP_STATS.swap(false, Ordering::Relaxed) {
                self.write_stats();
            }
            let timeout = if !self.again.is_empty() {
                Some(0)
            } else {
                let now = now_ns();
                (self.queue.front())
                    .map(|head| head.due.saturating_sub(self.spin_ns).saturating_sub(now))
            };
            let ready = match self.epoll.wait(&mut events, timeout) {
                Ok(ready) => ready,
                Err(error) if error.kind() == ErrorKind::Interrupted => 0,
                Err(error) => return Err(error),
            };
            for token in std::mem::take(&mut self.again) {
                self.read(token);
            }
            for event in &events[..ready] {
                let (token, flags) = (event.u64, event.events as libc::c_int);
                match token {
                    LISTENER => self.accept(),
                    _ => {
                        if flags & libc::EPOLLOUT != 0 {
                            self.flush(token >> 1, (token & 1) as usize);
                        }
                        if flags & !libc::EPOLLOUT != 0 {
                            self.read(token);
                        }
                    }
                }
            }
        }
    }

    fn accept(&mut self) {
        loop {
            let client = match self.listener.accept() {
                Ok((client, _)) => client,
                Err(error) if error.kind() == ErrorKind::WouldBlock => return,
                Err(error) if error.kind() == ErrorKind::Interrupted => continue,
                Err(error) => {
                    // EMFILE and the like: the listener stays readable; do not spin on it.
                    eprintln!("delay-relay: accept: {error}");
                    std::thread::sleep(Duration::from_millis(10));
                    return;
                }
            };
            if let Err(error) = self.open(client) {
                eprintln!("delay-relay: {}: {error}", self.upstream.display());
            }
        }
    }

    fn open(&mut self, client: UnixStream) -> io::Result<()> {
        let server = UnixStream::connect(&self.upstream)?;
        client.set_nonblocking(true)?;
        server.set_nonblocking(true)?;
        let id = self.next_id;
        self.next_id += 1;
        self.epoll.add(client.as_raw_fd(), id << 1, READ_EVENTS)?;
        self.epoll
            .add(server.as_raw_fd(), id << 1 | 1, READ_EVENTS)?;
        let side = |stream| Side {
            stream,
            out: Vec::new(),
            want_out: false,
            reading: true,
            close_after_out: false,
            shut: false,
        };
        self.conns.insert(
            id,
            Conn {
                sides: [side(client), side(server)],
            },
        );
        Ok(())
    }

    /// Reads what `token`'s socket holds, queueing each chunk for the other side.
    fn read(&mut self, token: u64) {
        let (id, from) = (token >> 1, (token & 1) as usize);
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        let side = &mut conn.sides[from];
        if !side.reading {
            return;
        }
        for _ in 0..READS_PER_TURN {
            match (&side.stream).read(&mut self.buffer) {
                Ok(read) => {
                    let bytes = (read > 0).then(|| self.buffer[..read].to_vec());
                    self.queue.push_back(Chunk {
                        due: now_ns() + self.delay_ns,
                        conn: id,
                        to: 1 - from,
                        bytes,
                    });
                    if read == 0 {
                        side.reading = false;
                        return;
                    }
                }
                Err(error) if error.kind() == ErrorKind::WouldBlock => return,
                Err(error) if error.kind() == ErrorKind::Interrupted => {}
                Err(_) => {
                    self.conns.remove(&id);
                    return;
                }
            }
        }
        self.again.push(token);
    }

    /// Hands every chunk now due to its socket, then writes each socket given any, once.
    fn deliver_due(&mut self) {
        let mut now = now_ns();
        while let Some(head) = self.queue.front() {
            if head.due > now {
                if head.due - now > self.spin_ns {
                    break;
                }
                while now < head.due {
                    std::hint::spin_loop();
                    now = now_ns();
                }
            }
            let Some(chunk) = self.queue.pop_front() else {
                break;
            };
            let late = ((now.saturating_sub(chunk.due)) / 1000) as usize;
            self.late_us[late.min(LATE_BUCKETS - 1)] += 1;
            let Some(conn) = self.conns.get_mut(&chunk.conn) else {
                continue;
            };
            let side = &mut conn.sides[chunk.to];
            if side.out.is_empty() && !side.close_after_out {
                self.dirty.push((chunk.conn, chunk.to));
            }
            match chunk.bytes {
                Some(bytes) if side.out.is_empty() => side.out = bytes,
                Some(bytes) => side.out.extend_from_slice(&bytes),
                None => side.close_after_out = true,
            }
        }
        for (id, to) in std::mem::take(&mut self.dirty) {
            self.flush(id, to);
        }
    }

    fn write_stats(&self) {
        let Some(path) = &self.stats else { return };
        let counts: Vec<String> = self.late_us.iter().map(u64::to_string).collect();
        let line = format!("late_us {}\n", counts.join(" "));
        if let Err(error) = std::fs::write(path, line) {
            eprintln!("delay-relay: {}: {error}", path.display());
        }
    }

    /// Writes what `to` has due; shuts its writing down once that is all and its peer has closed.
    fn flush(&mut self, id: u64, to: usize) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        let side = &mut conn.sides[to];
        let mut written = 0;
        while written < side.out.len() {
            match (&side.stream).write(&side.out[written..]) {
                Ok(n) => written += n,
                Err(error) if error.kind() == ErrorKind::WouldBlock => break,
                Err(error) if error.kind() == ErrorKind::Interrupted => {}
                Err(_) => {
                    self.conns.remove(&id);
                    return;
                }
            }
        }
        side.out.drain(..written);
        let want_out = !side.out.is_empty();
        if want_out != side.want_out {
            let events = if want_out {
                READ_EVENTS | libc::EPOLLOUT
            } else {
                READ_EVENTS
            };
            if self
                .epoll
                .modify(side.stream.as_raw_fd(), id << 1 | to as u64, events)
                .is_err()
            {
                self.conns.remove(&id);
                return;
            }
            side.want_out = want_out;
        }
        if !want_out && side.close_after_out && !side.shut {
            let _ = side.stream.shutdown(Shutdown::Write);
            side.shut = true;
        }
        if conn.sides.iter().all(|side| side.shut && !side.reading) {
            self.conns.remove(&id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;
    use std::time::Instant;

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
        let (echo, relay) = (dir.join("echo.sock"), dir.join("relay.sock"));
        echo_server(&echo);
        let listener = UnixListener::bind(&relay).unwrap();
        let delay = Delay {
            delay,
            spin: Duration::ZERO,
        };
        thread::spawn(move || serve(listener, &echo, delay, None));
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
        thread::spawn(move || serve(listener, &missing, delay, None));
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
