//! The results table: percentiles, throughput, and ratios to baselines.

use super::run::Stats;

/// One table row: a scenario, its measurements, and what to compare with.
pub struct Row<'a> {
    /// Scenario name (e.g. `5 nodes, one slowed +20 ms`).
    pub scenario: String,
    /// The measurements of this row.
    pub stats: &'a Stats,
    /// The floor of the same scenario, if any.
    pub floor: Option<&'a Stats>,
    /// The peer client of the same scenario, if any.
    pub peer: Option<&'a Stats>,
}

/// A Markdown table: p50 / p99 / p99.9 (µs), ops/s, failures, and p50 (or,
/// for throughput rows, ops/s) ratios to the floor and the peer.
pub fn table(rows: &[Row<'_>], throughput: bool) -> String {
    let mut out = String::from(
        "| scenario | client | p50 µs | p99 µs | p99.9 µs | ops/s | failed | vs floor | vs peer |\n\
         | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for row in rows {
        let s = row.stats;
        let ratio = |base: Option<&Stats>| match base {
            Some(base) if throughput && base.ops_per_sec() > 0.0 => {
                format!("{:.2}x", s.ops_per_sec() / base.ops_per_sec())
            }
            Some(base) if !throughput && base.quantile_us(0.5) > 0 && s.ops() > 0 => {
                format!(
                    "{:.2}x",
                    s.quantile_us(0.5) as f64 / base.quantile_us(0.5) as f64
                )
            }
            _ => "–".to_owned(),
        };
        let ops = if s.elapsed.is_zero() {
            "–".to_owned()
        } else {
            format!("{:.0}", s.ops_per_sec())
        };
        let quantile = |q| {
            if s.ops() == 0 {
                "–".to_owned()
            } else {
                s.quantile_us(q).to_string()
            }
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            row.scenario,
            s.name,
            quantile(0.5),
            quantile(0.99),
            quantile(0.999),
            ops,
            s.failures,
            ratio(row.floor),
            ratio(row.peer),
        ));
    }
    out
}
