//! `lane_wait_seconds`: how long a command or a borrower waited for its lane's ceiling. Nearly
//! every observation is a grant without waiting, made once per multiplexed command; here that
//! costs one atomic add, where prometheus-client's histogram locks a mutex and searches its buckets
//! for every observation. A wait that really happened (rare, and slow anyway) is kept as that
//! histogram keeps it. Encoded, the two are one classic histogram, exactly as prometheus-client's
//! would be had it observed each grant as a wait of 0 seconds (a test holds them to the same text).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

/// A histogram of waits whose zero-length observations cost an atomic add; cheap to clone (the
/// clones share their counts, as a family's handles do).
#[derive(Clone, Debug)]
pub(crate) struct WaitHistogram(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    /// Grants without waiting: observations of 0 s, all in the first bucket.
    immediate: AtomicU64,
    waited: Mutex<Waited>,
}

/// The observations of real waits, as prometheus-client keeps them: per-bucket counts (made
/// cumulative when encoded), the last bucket `+Inf`.
#[derive(Debug)]
struct Waited {
    sum: f64,
    count: u64,
    buckets: Vec<(f64, u64)>,
}

impl WaitHistogram {
    /// A histogram with these upper bounds (a `+Inf` bucket is added).
    pub(crate) fn new(bounds: impl IntoIterator<Item = f64>) -> Self {
        let buckets = bounds
            .into_iter()
            .filter(|bound| bound.is_finite())
            .chain(std::iter::once(f64::INFINITY))
            .map(|bound| (bound, 0))
            .collect();
        WaitHistogram(Arc::new(Inner {
            immediate: AtomicU64::new(0),
            waited: Mutex::new(Waited {
                sum: 0.0,
                count: 0,
                buckets,
            }),
        }))
    }

    /// A grant that did not wait.
    pub(crate) fn immediate(&self) {
        self.0.immediate.fetch_add(1, Ordering::Relaxed);
    }

    /// A grant after waiting `seconds`.
    pub(crate) fn observe(&self, seconds: f64) {
        let mut waited = self.0.waited.lock();
        waited.sum += seconds;
        waited.count += 1;
        let last = waited.buckets.len() - 1;
        let at = match seconds.is_nan() {
            true => last,
            false => waited
                .buckets
                .iter()
                .position(|(bound, _)| *bound >= seconds)
                .unwrap_or(last),
        };
        waited.buckets[at].1 += 1;
    }
}

impl TypedMetric for WaitHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for WaitHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let (sum, count, mut buckets) = {
            let waited = self.0.waited.lock();
            (waited.sum, waited.count, waited.buckets.clone())
        };
        // Read after the waits: a grant counted between the two reads shows in the next scrape.
        let immediate = self.0.immediate.load(Ordering::Relaxed);
        // The first bucket's bound is never below 0 (the lanes' buckets start at 10 µs).
        buckets[0].1 += immediate;
        encoder.encode_histogram::<NoLabelSet>(sum, count + immediate, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;
    use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
    use prometheus_client::registry::Registry;

    fn text(register: impl FnOnce(&mut Registry)) -> String {
        let mut registry = Registry::default();
        register(&mut registry);
        let mut out = String::new();
        encode(&mut out, &registry).unwrap();
        out
    }

    #[test]
    fn it_encodes_as_prometheus_clients_histogram_fed_the_same_waits() {
        let bounds = || exponential_buckets(0.00001, 4.0, 12);
        let ours = WaitHistogram::new(bounds());
        let theirs = Histogram::new(bounds());
        let waits = [0.0, 0.0, 0.000_05, 0.003, 0.0, 2.5, 100.0, 0.000_01];
        for wait in waits {
            match wait == 0.0 {
                true => ours.immediate(),
                false => ours.observe(wait),
            }
            theirs.observe(wait);
        }
        let ours = text(|r| r.register("lane_wait_seconds", "Waits", ours.clone()));
        let theirs = text(|r| r.register("lane_wait_seconds", "Waits", theirs.clone()));
        assert_eq!(ours, theirs);
        assert!(ours.contains("lane_wait_seconds_count 8"), "{ours}");
        assert!(
            ours.contains("lane_wait_seconds_bucket{le=\"0.00001\"} 4"),
            "{ours}"
        );
    }

    #[test]
    fn an_empty_histogram_encodes_as_prometheus_clients_empty_one() {
        let bounds = || exponential_buckets(0.00001, 4.0, 12);
        let ours = WaitHistogram::new(bounds());
        let theirs = Histogram::new(bounds());
        assert_eq!(
            text(|r| r.register("w", "Waits", ours)),
            text(|r| r.register("w", "Waits", theirs))
        );
    }

    #[test]
    fn clones_share_their_counts() {
        let one = WaitHistogram::new([1.0]);
        let other = one.clone();
        other.immediate();
        one.observe(5.0);
        let encoded = text(|r| r.register("w", "Waits", one));
        assert!(encoded.contains("w_count 2"), "{encoded}");
        assert!(encoded.contains("w_bucket{le=\"1.0\"} 1"), "{encoded}");
        assert!(encoded.contains("w_bucket{le=\"+Inf\"} 2"), "{encoded}");
    }
}
