//! Log output: human-readable lines by default, one JSON object per line when asked.

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Installs the global subscriber; `RUST_LOG` overrides `level`. A second call is a no-op.
pub fn init(format: LogFormat, level: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
