//! The Prometheus text exposition format, written in one place: every part of the gateway
//! that has metrics writes its families through an [`Exposition`], which owns the
//! `# HELP` / `# TYPE` lines, label escaping and the histogram layout, so no module
//! formats exposition text by hand.

use std::fmt::{Display, Write as _};

/// Upper bounds of the latency histogram buckets, in seconds.
const BUCKETS_S: &[f64] =
    &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

/// What a metric family is, as its `# TYPE` line says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// `/metrics` text being written.
#[derive(Debug, Default)]
pub struct Exposition {
    out: String,
}

impl Exposition {
    pub fn new() -> Self {
        Exposition { out: String::with_capacity(8192) }
    }

    /// Opens the family `name`: its `# HELP` and `# TYPE` lines; samples follow.
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) -> Family<'_> {
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {}", kind.name());
        Family { out: &mut self.out, name: name.to_owned() }
    }

    /// The whole text, in the order the families were written.
    pub fn into_text(self) -> String {
        self.out
    }

    /// What `write` writes, alone (one part's text, as tests read it).
    #[cfg(test)]
    pub(crate) fn text_of(write: impl FnOnce(&mut Exposition)) -> String {
        let mut out = Exposition::new();
        write(&mut out);
        out.into_text()
    }
}

/// One family's samples, written after its `# HELP` and `# TYPE` lines.
#[derive(Debug)]
pub struct Family<'a> {
    out: &'a mut String,
    name: String,
}

impl Family<'_> {
    /// One sample: `name{labels} value`, label values escaped.
    pub fn sample(&mut self, labels: &[(&str, &str)], value: impl Display) -> &mut Self {
        let _ = writeln!(self.out, "{}{} {value}", self.name, LabelSet(labels, None));
        self
    }

    /// One histogram's `_bucket`, `_sum` and `_count` samples under `labels`.
    pub fn histogram(&mut self, labels: &[(&str, &str)], h: &Histogram) -> &mut Self {
        let name = &self.name;
        let counts = h.counts.iter().copied().chain(std::iter::repeat(0));
        for (bound, c) in BUCKETS_S.iter().zip(counts) {
            let le = bound.to_string();
            let _ = writeln!(self.out, "{name}_bucket{} {c}", LabelSet(labels, Some(&le)));
        }
        let _ = writeln!(self.out, "{name}_bucket{} {}", LabelSet(labels, Some("+Inf")), h.count);
        let _ = writeln!(self.out, "{name}_sum{} {}", LabelSet(labels, None), h.sum_s);
        let _ = writeln!(self.out, "{name}_count{} {}", LabelSet(labels, None), h.count);
        self
    }
}

/// `{key="value",...}` (nothing when empty), with an optional trailing `le` label.
struct LabelSet<'a>(&'a [(&'a str, &'a str)], Option<&'a str>);

impl Display for LabelSet<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let LabelSet(labels, le) = self;
        if labels.is_empty() && le.is_none() {
            return Ok(());
        }
        f.write_char('{')?;
        let le = le.map(|v| ("le", v));
        for (i, (key, value)) in labels.iter().copied().chain(le).enumerate() {
            if i > 0 {
                f.write_char(',')?;
            }
            write!(f, "{key}=\"{}\"", escape(value))?;
        }
        f.write_char('}')
    }
}

/// A latency histogram over fixed buckets from 0.5 ms to 60 s.
#[derive(Debug, Default)]
pub struct Histogram {
    counts: Vec<u64>,
    sum_s: f64,
    count: u64,
}

impl Histogram {
    pub fn observe(&mut self, seconds: f64) {
        if self.counts.is_empty() {
            self.counts = vec![0; BUCKETS_S.len()];
        }
        for (bound, c) in BUCKETS_S.iter().zip(self.counts.iter_mut()) {
            if seconds <= *bound {
                *c += 1;
            }
        }
        self.sum_s += seconds;
        self.count += 1;
    }
}

/// A label value escaped per the exposition format.
fn escape(value: &str) -> std::borrow::Cow<'_, str> {
    if value.contains(['\\', '"', '\n']) {
        value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n").into()
    } else {
        value.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_samples_and_histograms_in_the_text_format() {
        let mut h = Histogram::default();
        h.observe(0.003);
        h.observe(0.03);
        let mut out = Exposition::new();
        out.family("x_total", Kind::Counter, "Things.").sample(&[], 3).sample(&[("a", "1"), ("b", "q\"")], 4);
        out.family("x_seconds", Kind::Histogram, "Time.").histogram(&[("route", "/r")], &h);
        let text = out.into_text();
        assert!(text.starts_with("# HELP x_total Things.\n# TYPE x_total counter\nx_total 3\n"), "{text}");
        assert!(text.contains("x_total{a=\"1\",b=\"q\\\"\"} 4\n"), "{text}");
        assert!(text.contains("x_seconds_bucket{route=\"/r\",le=\"0.005\"} 1\n"), "{text}");
        assert!(text.contains("x_seconds_bucket{route=\"/r\",le=\"+Inf\"} 2\n"), "{text}");
        assert!(text.contains("x_seconds_count{route=\"/r\"} 2\n"), "{text}");
    }

    #[test]
    fn an_empty_histogram_has_every_bucket_at_zero() {
        let mut out = Exposition::new();
        out.family("y", Kind::Histogram, "Y.").histogram(&[("k", "v")], &Histogram::default());
        let text = out.into_text();
        assert_eq!(text.matches("y_bucket{").count(), BUCKETS_S.len() + 1, "{text}");
        assert!(text.contains("y_bucket{k=\"v\",le=\"60\"} 0\n"), "{text}");
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\n"), "a\\\"b\\\\c\\n");
    }
}
