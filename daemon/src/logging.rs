//! Log output: human-readable lines by default, one JSON object per line when asked. Each line
//! carries the spans it was logged in: a RESP session's (`resp{client uid pid principal}`), an HTTP
//! request's (`http{method path uid pid principal}`), a lane connection's (`lane{lane connection
//! node}`).

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Installs the global subscriber; `RUST_LOG` overrides `level`. A second call is a no-op.
pub fn init(format: LogFormat, level: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    // Colours only for a person at a terminal: escape codes in a log file or journal are noise
    // that also breaks every search for `field=value`.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
