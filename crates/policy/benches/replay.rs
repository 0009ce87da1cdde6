//! `tollgate policy replay`'s work on a large decision log: a generated log of the tenants example
//! (both tenants reading and writing their own, the other's and the shared keys, as `keys: digest`
//! writes them, with a malformed line now and then), replayed against a changed policy with the
//! old one given. Prints the log's size, lines per second and the process's peak RSS before and
//! after the replay: memory that does not grow with the log is what this shows.
//!
//! `cargo bench -p tollgate-policy --bench replay` (1 GiB; `TOLLGATE_REPLAY_BYTES` for another
//! size). The log is written to a temporary directory first and is not part of the timing.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use tollgate_policy::classes::generated::{self, Draw};
use tollgate_policy::classes::replay::Replayer;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

/// The process's peak resident set so far, in KiB (`VmHWM`).
fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Writes about `bytes` of log lines; returns how many.
fn write_log(path: &Path, bytes: u64) -> u64 {
    let mut out = BufWriter::with_capacity(1 << 20, std::fs::File::create(path).unwrap());
    let mut draw = Draw(0x5eed);
    let commands = [
        ("GET", "admitted"),
        ("SET", "admitted"),
        ("MGET", "admitted"),
        ("DEL", "admitted"),
        ("HSET", "admitted"),
    ];
    let (mut written, mut lines) = (0u64, 0u64);
    let mut ts = 1_764_633_600_000u64;
    while written < bytes {
        let acme = draw.below(2) == 0;
        let (tenant, uid) = if acme {
            ("acme", 2001)
        } else {
            ("globex", 2002)
        };
        let (command, _) = commands[draw.below(commands.len())];
        let region = match draw.below(4) {
            0 => "shared:x",
            1 if acme => "globex:x",
            1 => "acme:x",
            _ if acme => "acme:x",
            _ => "globex:x",
        };
        ts += draw.below(20) as u64;
        let line = if draw.below(100_000) == 0 {
            "{\"ts_ms\": truncated by a crash\n".to_owned()
        } else {
            format!(
                "{{\"ts_ms\":{ts},\"principal\":\"{tenant}\",\"uid\":{uid},\"gid\":100,\"pid\":4242,\"command\":\"{command}\",\"lane\":\"regular\",\"keys\":[\"{:016x}\"],\"regions\":[\"{region}\"],\"decision\":\"admitted\",\"rule\":\"{tenant}-keys\",\"module\":\"\",\"cause\":null,\"generation\":1,\"latency_ns\":{}}}\n",
                draw.bits(),
                500 + draw.below(2000)
            )
        };
        out.write_all(line.as_bytes()).unwrap();
        written += line.len() as u64;
        lines += 1;
    }
    out.flush().unwrap();
    lines
}

fn main() {
    let bytes: u64 = std::env::var("TOLLGATE_REPLAY_BYTES")
        .ok()
        .and_then(|b| b.parse().ok())
        .unwrap_or(1 << 30);
    let dir = tempfile::tempdir().unwrap();
    let old_path = repo("policies/examples/tenants.yaml");
    let text = std::fs::read_to_string(&old_path).unwrap();
    // The change of the replay test: shared keys writable, acme's reads narrowed to its own.
    let a = text.find("  # A deny rule with `keys:`").unwrap();
    let b = text.find("  - id: acme-keys").unwrap();
    let changed = format!("{}{}", &text[..a], &text[b..]).replacen(
        r#"keys: ["acme:*", "shared:*"]"#,
        r#"keys: ["acme:*"]"#,
        1,
    );
    let changed = changed[..changed.find("\ntests:").unwrap()].to_owned();
    let new_path = dir.path().join("tenants-new.yaml");
    std::fs::write(&new_path, changed).unwrap();
    let log = dir.path().join("decisions.jsonl");
    let lines = write_log(&log, bytes);
    let size = std::fs::metadata(&log).unwrap().len();

    let old = generated::load(&old_path);
    let new = generated::load(&new_path);
    let before = peak_rss_kib();
    let started = Instant::now();
    let mut replayer = Replayer::new(Some(&old), &new);
    let file = std::fs::File::open(&log).unwrap();
    replayer
        .read(
            "decisions.jsonl",
            std::io::BufReader::with_capacity(1 << 16, file),
        )
        .unwrap();
    let (replay, _) = replayer.finish();
    let elapsed = started.elapsed();
    let after = peak_rss_kib();
    assert_eq!(replay.lines, lines);
    println!(
        "replay of {:.2} GiB ({lines} lines, {} malformed): {:.1} s, {:.0} lines/s, {:.1} MiB/s; {} changed in {} groups",
        size as f64 / (1u64 << 30) as f64,
        replay.malformed,
        elapsed.as_secs_f64(),
        lines as f64 / elapsed.as_secs_f64(),
        size as f64 / (1 << 20) as f64 / elapsed.as_secs_f64(),
        replay.changed,
        replay.groups.len(),
    );
    println!(
        "peak RSS: {:.1} MiB before the replay (policies loaded), {:.1} MiB after",
        before as f64 / 1024.0,
        after as f64 / 1024.0
    );
}
