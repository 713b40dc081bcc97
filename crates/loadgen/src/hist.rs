//! Latency histograms: HdrHistogram (3 significant digits, ≤0.1% relative error), mergeable
//! across jobs, repetitions and runs, serialized in the standard compressed V2 format as base64
//! (readable by every HdrHistogram implementation, e.g. `HistogramLogProcessor`).

use base64::Engine as _;
use hdrhistogram::Histogram;
use hdrhistogram::serialization::{Deserializer, Serializer, V2DeflateSerializer};

/// Highest trackable latency: one hour in nanoseconds (larger values saturate).
const MAX_NS: u64 = 3_600_000_000_000;

/// The percentiles every report carries.
pub(crate) const PERCENTILES: [f64; 8] = [1.0, 5.0, 50.0, 90.0, 95.0, 99.0, 99.9, 99.99];

/// A latency histogram in nanoseconds.
#[derive(Clone)]
pub struct LatHist(Histogram<u64>);

impl std::fmt::Debug for LatHist {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LatHist(n={})", self.0.len())
    }
}

impl Default for LatHist {
    fn default() -> Self {
        Self::with_sigfig(3)
    }
}

impl LatHist {
    /// A histogram with `sigfig` significant decimal digits (2 for per-second samples).
    pub fn with_sigfig(sigfig: u8) -> LatHist {
        // Bounds are constants within hdrhistogram's limits, so creation cannot fail.
        match Histogram::new_with_bounds(1, MAX_NS, sigfig) {
            Ok(h) => LatHist(h),
            Err(_) => unreachable!("constant histogram bounds are valid"),
        }
    }
    /// Records one latency of `ns` nanoseconds (clamped to 1 ns ..= 1 h).
    #[inline]
    pub fn record(&mut self, ns: u64) {
        self.0.saturating_record(ns.clamp(1, MAX_NS));
    }
    /// Records `n` latencies of `ns` nanoseconds each.
    pub fn record_n(&mut self, ns: u64, n: u64) {
        // Values are clamped into range, so this only fails on count overflow, which saturates.
        let _ = self.0.record_n(ns.clamp(1, MAX_NS), n);
    }
    /// Add all samples of `other`.
    pub fn merge(&mut self, other: &LatHist) {
        // Same bounds on both sides (or auto-resize), so addition cannot fail.
        let _ = self.0.add(&other.0);
    }
    /// Latencies recorded.
    pub fn count(&self) -> u64 {
        self.0.len()
    }
    /// Their mean, ns (0 when empty).
    pub fn mean(&self) -> f64 {
        self.0.mean()
    }
    /// Their standard deviation, ns.
    pub fn stdev(&self) -> f64 {
        self.0.stdev()
    }
    /// The smallest, ns (0 when empty).
    pub fn min(&self) -> u64 {
        if self.0.is_empty() { 0 } else { self.0.min() }
    }
    /// The largest, ns (0 when empty).
    pub fn max(&self) -> u64 {
        self.0.max()
    }
    /// Value at percentile `p` (0–100), 0 when empty.
    pub fn percentile(&self, p: f64) -> u64 {
        if self.0.is_empty() {
            0
        } else {
            self.0.value_at_quantile(p / 100.0)
        }
    }
    /// `(value, count)` for every non-empty bucket (compact, for per-second samples).
    pub fn sparse(&self) -> Vec<(u64, u64)> {
        self.0
            .iter_recorded()
            .map(|v| (v.value_iterated_to(), v.count_at_value()))
            .collect()
    }
    /// `(latency_ns, cumulative fraction)` points for a CDF plot.
    pub fn cdf(&self) -> Vec<(u64, f64)> {
        let total = self.0.len().max(1) as f64;
        let mut acc = 0u64;
        self.0
            .iter_recorded()
            .map(|v| {
                acc += v.count_at_value();
                (v.value_iterated_to(), acc as f64 / total)
            })
            .collect()
    }
    /// Compressed V2 encoding, base64 (the HdrHistogram log format's payload).
    pub fn to_base64(&self) -> String {
        let mut buf = Vec::new();
        match V2DeflateSerializer::new().serialize(&self.0, &mut buf) {
            Ok(_) => base64::engine::general_purpose::STANDARD.encode(buf),
            Err(_) => String::new(),
        }
    }
    /// Decode [`LatHist::to_base64`] output.
    pub fn from_base64(s: &str) -> Option<LatHist> {
        let bytes = base64::engine::general_purpose::STANDARD.decode(s).ok()?;
        let h: Histogram<u64> = Deserializer::new()
            .deserialize(&mut bytes.as_slice())
            .ok()?;
        Some(LatHist(h))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_merge_and_roundtrip() {
        let mut a = LatHist::default();
        let mut b = LatHist::default();
        for i in 1..=1000u64 {
            a.record(i * 1000);
            b.record(i * 1000 + 1_000_000);
        }
        let p50 = a.percentile(50.0) as f64;
        assert!((p50 - 500_000.0).abs() / 500_000.0 < 0.002, "{p50}");
        a.merge(&b);
        assert_eq!(a.count(), 2000);
        let p = a.percentile(50.0) as f64;
        assert!((p - 1_000_000.0).abs() / 1_000_000.0 < 0.002, "{p}");
        let c = LatHist::from_base64(&a.to_base64()).unwrap();
        assert_eq!(c.count(), 2000);
        assert_eq!(c.percentile(99.0), a.percentile(99.0));
        assert_eq!(a.cdf().last().unwrap().1, 1.0);
        assert!(LatHist::from_base64("!!").is_none());
        assert_eq!(LatHist::default().percentile(50.0), 0);
    }
}
