//! `GET /metrics`: the server's counters in Prometheus' text format (version 0.0.4).
//!
//! Requests by route and status, prompt and generated tokens, connections, the engine's queue
//! and sequences, and two latency histograms measured on the engine's thread: time to first
//! token (from a request's submission to the engine to its first token) and inter-token latency
//! (between a request's consecutive tokens); the prefix cache's hits, misses, reused prompt
//! tokens and the GPU memory its entries hold.

use crate::decode::prefix::PrefixStats;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Counters the HTTP side reads (`/health`, `/metrics`); set from the engine before the first
/// request and after each step.
#[derive(Debug, Default)]
pub struct Load {
    pub active: AtomicUsize,
    pub queued: AtomicUsize,
    pub served: AtomicUsize,
    /// Sequences free for new requests.
    pub free: AtomicUsize,
    /// The engine failed (the GPU): requests are refused.
    pub broken: AtomicBool,
    /// The prefix cache's counters.
    prefix: Mutex<PrefixStats>,
}

impl Load {
    /// Records the prefix cache's counters.
    pub fn set_prefix(&self, stats: PrefixStats) {
        *self.prefix.lock().unwrap_or_else(|e| e.into_inner()) = stats;
    }

    pub fn prefix(&self) -> PrefixStats {
        *self.prefix.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A histogram of durations with fixed upper bounds (seconds).
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Observations per bucket (not cumulative); the last counts those above every bound.
    counts: Vec<AtomicU64>,
    sum_us: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Self { bounds, counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(), sum_us: AtomicU64::new(0) }
    }

    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        let i = self.bounds.iter().position(|&b| s <= b).unwrap_or(self.bounds.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut total = 0;
        for (i, c) in self.counts.iter().enumerate() {
            total += c.load(Ordering::Relaxed);
            let le = self.bounds.get(i).map_or("+Inf".to_string(), |b| b.to_string());
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {total}");
        }
        let sum = self.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {total}");
    }
}

/// Time to first token: a prompt's prefill and its wait for a sequence.
const TTFT_BOUNDS: &[f64] = &[0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
/// Inter-token latency: one decode step of the batch.
const ITL_BOUNDS: &[f64] = &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];

/// What `/metrics` reports besides the engine's [`Load`].
#[derive(Debug)]
pub struct Metrics {
    /// Responses by route (the matched pattern, `other` for none) and HTTP status.
    requests: Mutex<BTreeMap<(&'static str, u16), u64>>,
    pub prompt_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    pub ttft: Histogram,
    pub itl: Histogram,
    /// Connections open now.
    pub connections: AtomicUsize,
    /// Connections refused because `--max-connections` were open.
    pub connections_refused: AtomicU64,
    /// Request bodies that did not arrive within the body timeout (answered 408).
    pub body_timeouts: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            requests: Mutex::default(),
            prompt_tokens: AtomicU64::new(0),
            generated_tokens: AtomicU64::new(0),
            ttft: Histogram::new(TTFT_BOUNDS),
            itl: Histogram::new(ITL_BOUNDS),
            connections: AtomicUsize::new(0),
            connections_refused: AtomicU64::new(0),
            body_timeouts: AtomicU64::new(0),
        }
    }
}

/// The routes the counters name (a request's matched pattern is one of these, or `other`).
pub const ROUTES: [&str; 6] =
    ["/health", "/metrics", "/v1/models", "/v1/models/{model}", "/v1/chat/completions", "/v1/completions"];

impl Metrics {
    /// Counts one response of `route` (a matched pattern; anything else is `other`).
    pub fn count_request(&self, route: Option<&str>, status: u16) {
        let route = route.and_then(|r| ROUTES.iter().find(|&&k| k == r).copied()).unwrap_or("other");
        let mut m = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        *m.entry((route, status)).or_default() += 1;
    }

    /// The text `/metrics` answers.
    pub fn render(&self, load: &Load) -> String {
        let mut out = String::new();
        let counter = |out: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
        };
        let gauge = |out: &mut String, name: &str, help: &str, v: usize| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        let name = "wgpu_llm_requests_total";
        let _ = writeln!(out, "# HELP {name} HTTP responses by route and status.\n# TYPE {name} counter");
        for ((route, code), n) in self.requests.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let _ = writeln!(out, "{name}{{route=\"{route}\",code=\"{code}\"}} {n}");
        }
        let ld = |a: &AtomicUsize| a.load(Ordering::Relaxed);
        let tokens = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let prompt = tokens(&self.prompt_tokens);
        counter(&mut out, "wgpu_llm_prompt_tokens_total", "Prompt tokens of the requests the engine took.", prompt);
        counter(&mut out, "wgpu_llm_generated_tokens_total", "Tokens generated.", tokens(&self.generated_tokens));
        counter(&mut out, "wgpu_llm_requests_finished_total", "Requests the engine finished.", ld(&load.served) as u64);
        gauge(&mut out, "wgpu_llm_queue_length", "Requests waiting for a sequence.", ld(&load.queued));
        gauge(&mut out, "wgpu_llm_sequences_active", "Sequences decoding a request.", ld(&load.active));
        gauge(&mut out, "wgpu_llm_sequences_free", "Sequences free for a new request.", ld(&load.free));
        gauge(&mut out, "wgpu_llm_connections_open", "HTTP connections open.", ld(&self.connections));
        let refused = tokens(&self.connections_refused);
        counter(&mut out, "wgpu_llm_connections_refused_total", "Connections refused at the bound.", refused);
        let timeouts = tokens(&self.body_timeouts);
        counter(&mut out, "wgpu_llm_body_timeouts_total", "Request bodies not received in time (408).", timeouts);
        self.ttft.render(
            &mut out,
            "wgpu_llm_time_to_first_token_seconds",
            "From a request's submission to the engine to its first token.",
        );
        self.itl.render(&mut out, "wgpu_llm_inter_token_latency_seconds", "Between a request's consecutive tokens.");
        render_prefix(&mut out, &load.prefix());
        out
    }
}

/// The prefix cache's counters: hits and misses (a hit rate is hits / (hits + misses)), prompt
/// tokens reused, and what it holds now.
fn render_prefix(out: &mut String, p: &PrefixStats) {
    let mut metric = |name: &str, kind: &str, help: &str, v: u64| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}");
    };
    metric("wgpu_llm_prefix_cache_hits_total", "counter", "Admissions that reused a cached prompt prefix.", p.hits);
    metric("wgpu_llm_prefix_cache_misses_total", "counter", "Admissions that reused nothing (cache on).", p.misses);
    let help = "Prompt tokens whose KV came from the prefix cache.";
    metric("wgpu_llm_prefix_cache_tokens_total", "counter", help, p.cached_tokens);
    metric("wgpu_llm_prefix_cache_entries", "gauge", "Token prefixes the cache holds.", p.entries as u64);
    metric("wgpu_llm_prefix_cache_bytes", "gauge", "GPU memory the cache's KV entries hold.", p.bytes);
    metric("wgpu_llm_prefix_cache_limit_bytes", "gauge", "The cache's byte limit (0: off).", p.limit);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::new(&[0.1, 1.0]);
        for ms in [50, 100, 500, 2000] {
            h.observe(Duration::from_millis(ms));
        }
        let mut out = String::new();
        h.render(&mut out, "x", "help");
        assert!(out.contains("x_bucket{le=\"0.1\"} 2\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"1\"} 3\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"+Inf\"} 4\n"), "{out}");
        assert!(out.contains("x_sum 2.65\nx_count 4\n"), "{out}");
        assert_eq!(h.count(), 4);
    }

    #[test]
    fn requests_are_counted_by_route_and_status() {
        let m = Metrics::default();
        m.count_request(Some("/v1/completions"), 200);
        m.count_request(Some("/v1/completions"), 200);
        m.count_request(Some("/v1/completions"), 400);
        m.count_request(None, 404);
        let out = m.render(&Load::default());
        assert!(out.contains("wgpu_llm_requests_total{route=\"/v1/completions\",code=\"200\"} 2\n"), "{out}");
        assert!(out.contains("wgpu_llm_requests_total{route=\"/v1/completions\",code=\"400\"} 1\n"), "{out}");
        assert!(out.contains("wgpu_llm_requests_total{route=\"other\",code=\"404\"} 1\n"), "{out}");
        assert!(out.contains("# TYPE wgpu_llm_time_to_first_token_seconds histogram\n"), "{out}");
    }

    #[test]
    fn prefix_cache_counters_are_rendered() {
        let load = Load::default();
        let stats = PrefixStats { hits: 3, misses: 2, cached_tokens: 120, entries: 4, bytes: 4096, limit: 1 << 20 };
        load.set_prefix(stats);
        let out = Metrics::default().render(&load);
        for line in [
            "wgpu_llm_prefix_cache_hits_total 3\n",
            "wgpu_llm_prefix_cache_misses_total 2\n",
            "wgpu_llm_prefix_cache_tokens_total 120\n",
            "wgpu_llm_prefix_cache_entries 4\n",
            "wgpu_llm_prefix_cache_bytes 4096\n",
            "wgpu_llm_prefix_cache_limit_bytes 1048576\n",
            "# TYPE wgpu_llm_prefix_cache_hits_total counter\n",
            "# TYPE wgpu_llm_prefix_cache_bytes gauge\n",
        ] {
            assert!(out.contains(line), "{line:?} in\n{out}");
        }
    }
}
