//! Reading what the `metrics` facade recorded, through
//! `metrics_util`'s debugging recorder (tests with the `metrics` feature).
#![allow(dead_code)]

use metrics_util::debugging::{DebugValue, Snapshotter};

/// One recorded series: name, labels, value.
pub struct Series {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: DebugValue,
}

pub fn drain(snapshotter: &Snapshotter) -> Vec<Series> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let key = key.key();
            Series {
                name: key.name().to_owned(),
                labels: key
                    .labels()
                    .map(|l| (l.key().to_owned(), l.value().to_owned()))
                    .collect(),
                value,
            }
        })
        .collect()
}

/// Series named `name` that carry every label in `labels`.
pub fn matching<'a>(
    series: &'a [Series],
    name: &'a str,
    labels: &'a [(&str, &str)],
) -> impl Iterator<Item = &'a Series> {
    series.iter().filter(move |s| {
        s.name == name
            && labels
                .iter()
                .all(|(k, v)| s.labels.iter().any(|(sk, sv)| sk == k && sv == v))
    })
}

pub fn counter(series: &[Series], name: &str, labels: &[(&str, &str)]) -> u64 {
    matching(series, name, labels)
        .map(|s| match &s.value {
            DebugValue::Counter(n) => *n,
            other => panic!("{name} is not a counter: {other:?}"),
        })
        .sum()
}

pub fn samples(series: &[Series], name: &str, labels: &[(&str, &str)]) -> usize {
    matching(series, name, labels)
        .map(|s| match &s.value {
            DebugValue::Histogram(values) => values.len(),
            other => panic!("{name} is not a histogram: {other:?}"),
        })
        .sum()
}

/// The value of the gauge `name` with `labels` (the last set), if any.
pub fn gauge(series: &[Series], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    matching(series, name, labels)
        .map(|s| match &s.value {
            DebugValue::Gauge(value) => value.into_inner(),
            other => panic!("{name} is not a gauge: {other:?}"),
        })
        .next()
}
