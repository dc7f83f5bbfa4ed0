//! Small inline SVG charts, rendered on the server (no chart library, no script): bars
//! over time, two normal curves against each other, and a map of a response's bytes with
//! the findings' spans. Colours come from classes in the stylesheet; every label is
//! escaped. Each chart carries a `<title>` and `role="img"` for screen readers.

use std::fmt::Write as _;

use super::html::esc;

/// Bars for `values` (oldest first), `left` and `right` labelling the two ends of the
/// time axis. The plot stretches to the page's width; its labels are HTML below it, so
/// they keep their size.
pub fn bars(title: &str, values: &[u64], left: &str, right: &str) -> String {
    const W: f64 = 600.0;
    const H: f64 = 120.0;
    let max = values.iter().copied().max().unwrap_or(0).max(1);
    let n = values.len().max(1) as f64;
    let slot = W / n;
    let mut out = format!(
        "<figure class=\"plot\"><svg class=\"chart bars\" viewBox=\"0 0 {W} {H}\" role=\"img\" preserveAspectRatio=\"none\"><title>{}</title>",
        esc(title)
    );
    for (i, v) in values.iter().enumerate() {
        let h = (*v as f64 / max as f64) * (H - 4.0);
        let _ = write!(
            out,
            "<rect class=\"bar\" x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{h:.1}\"><title>{v}</title></rect>",
            i as f64 * slot + slot * 0.1,
            H - h,
            slot * 0.8
        );
    }
    let _ = write!(
        out,
        "<line class=\"axis\" x1=\"0\" y1=\"{H}\" x2=\"{W}\" y2=\"{H}\"/></svg>\
         <figcaption class=\"axis-labels\"><span>{}</span><span>tallest bar: {max}</span><span>{}</span></figcaption></figure>",
        esc(left),
        esc(right),
    );
    out
}

/// A tiny bar strip for a table cell.
pub fn sparkline(title: &str, values: &[u64]) -> String {
    let max = values.iter().copied().max().unwrap_or(0).max(1);
    let mut out = format!(
        "<svg class=\"chart spark\" viewBox=\"0 0 {} 20\" role=\"img\"><title>{}</title>",
        values.len() * 3,
        esc(title)
    );
    for (i, v) in values.iter().enumerate() {
        let h = (*v as f64 / max as f64) * 18.0;
        if *v > 0 {
            let _ = write!(
                out,
                "<rect class=\"bar\" x=\"{}\" y=\"{:.1}\" width=\"2\" height=\"{:.1}\"/>",
                i * 3,
                20.0 - h,
                h.max(1.0)
            );
        }
    }
    out.push_str("</svg>");
    out
}

/// A normal distribution, for [`curves`].
#[derive(Debug, Clone, Copy)]
pub struct Normal {
    pub mean: f64,
    pub stddev: f64,
}

/// The tenant's distribution drawn over the global baseline's (normal approximations from
/// each one's mean and standard deviation).
pub fn curves(title: &str, tenant: Normal, global: Normal) -> String {
    const W: f64 = 300.0;
    const H: f64 = 90.0;
    const STEPS: usize = 60;
    let floor = |n: Normal| n.stddev.max(1e-3);
    let lo = (tenant.mean - 4.0 * floor(tenant)).min(global.mean - 4.0 * floor(global));
    let hi = (tenant.mean + 4.0 * floor(tenant)).max(global.mean + 4.0 * floor(global));
    let density = |n: Normal, x: f64| {
        let s = floor(n);
        (-0.5 * ((x - n.mean) / s).powi(2)).exp() / s
    };
    let xs: Vec<f64> = (0..=STEPS).map(|i| lo + (hi - lo) * i as f64 / STEPS as f64).collect();
    let peak = xs.iter().map(|x| density(tenant, *x).max(density(global, *x))).fold(0.0, f64::max).max(1e-12);
    let path = |n: Normal| {
        xs.iter()
            .enumerate()
            .map(|(i, x)| {
                let px = W * i as f64 / STEPS as f64;
                let py = H - 4.0 - (density(n, *x) / peak) * (H - 14.0);
                format!("{}{px:.1},{py:.1}", if i == 0 { "M" } else { " L" })
            })
            .collect::<String>()
    };
    format!(
        "<svg class=\"chart curves\" viewBox=\"0 0 {W} {}\" role=\"img\"><title>{}</title>\
         <path class=\"global\" d=\"{}\"/><path class=\"tenant\" d=\"{}\"/>\
         <line class=\"axis\" x1=\"0\" y1=\"{}\" x2=\"{W}\" y2=\"{}\"/>\
         <text class=\"label\" x=\"0\" y=\"{}\">{lo:.2}</text><text class=\"label\" x=\"{W}\" y=\"{}\" text-anchor=\"end\">{hi:.2}</text></svg>",
        H + 14.0,
        esc(title),
        path(global),
        path(tenant),
        H - 4.0,
        H - 4.0,
        H + 10.0,
        H + 10.0,
    )
}

/// One finding's place in the response, for [`span_map`].
#[derive(Debug, Clone)]
pub struct Span {
    pub start: usize,
    pub end: usize,
    pub label: String,
}

/// The response's bytes as a strip: what the client received shaded, each finding's byte
/// span marked. Stretches to the page's width; the scale is HTML below it.
pub fn span_map(released: u64, spans: &[Span]) -> String {
    const W: f64 = 600.0;
    let total = spans.iter().map(|s| s.end as u64).chain(std::iter::once(released)).max().unwrap_or(0).max(1);
    let x = |b: f64| (b / total as f64 * W).clamp(0.0, W);
    let mut out = format!(
        "<figure class=\"plot\"><svg class=\"chart spans\" viewBox=\"0 0 {W} 30\" role=\"img\" preserveAspectRatio=\"none\">\
         <title>Response bytes: {released} released before the stop; findings marked</title>\
         <rect class=\"whole\" x=\"0\" y=\"6\" width=\"{W}\" height=\"18\"/>\
         <rect class=\"released\" x=\"0\" y=\"6\" width=\"{:.1}\" height=\"18\"><title>released: bytes 0–{released}</title></rect>",
        x(released as f64)
    );
    for s in spans {
        let (a, b) = (x(s.start as f64), x(s.end as f64));
        let _ = write!(
            out,
            "<rect class=\"hit\" x=\"{a:.1}\" y=\"2\" width=\"{:.1}\" height=\"26\"><title>{}: bytes {}–{}</title></rect>",
            (b - a).max(2.0),
            esc(&s.label),
            s.start,
            s.end
        );
    }
    let _ = write!(
        out,
        "</svg><figcaption class=\"axis-labels\"><span>byte 0</span><span>{released} released</span><span>{total} bytes</span></figcaption></figure>"
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_scale_to_the_largest_value_and_escape_labels() {
        let svg = bars("<x>", &[0, 5, 10], "<l>", "now");
        assert!(
            svg.contains("<title>&lt;x&gt;</title>") && svg.contains("&lt;l&gt;") && svg.contains("tallest bar: 10")
        );
        assert_eq!(svg.matches("class=\"bar\"").count(), 3);
        assert!(svg.contains("height=\"116.0\""), "the largest bar fills the plot: {svg}");
    }

    #[test]
    fn span_maps_mark_each_finding() {
        let svg = span_map(50, &[Span { start: 50, end: 90, label: "<rule>".into() }]);
        assert!(svg.contains("class=\"hit\"") && svg.contains("&lt;rule&gt;: bytes 50–90") && svg.contains("90 bytes"));
        assert!(!svg.contains("<rule>"));
    }

    #[test]
    fn curves_draw_both_distributions() {
        let svg = curves("t", Normal { mean: 3.0, stddev: 0.5 }, Normal { mean: 4.0, stddev: 0.0 });
        assert!(svg.contains("class=\"global\"") && svg.contains("class=\"tenant\"") && !svg.contains("NaN"));
    }
}
