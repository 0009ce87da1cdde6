//! The Prometheus registry behind `/metrics`. Each subsystem registers its own metrics at start-up;
//! after that the registry is read-only and encoding needs no lock on the hot path.

use prometheus_client::registry::Registry;

pub struct Metrics {
    registry: Registry,
}

impl Metrics {
    pub fn new(registry: Registry) -> Self {
        Self { registry }
    }

    /// The OpenMetrics text exposition of every registered metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("encoding into a String cannot fail");
        out
    }
}
