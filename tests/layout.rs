//! The library's files depend on each other in one direction only: from
//! the public types, through the orchestration and the wire, down to the
//! pure core. This test reads every `crate::` and `super::` path in
//! `src/` (outside `#[cfg(test)]` modules and comments), maps it to the
//! file it names, and checks each edge against the layer table below and
//! the whole graph for cycles. A new file must be placed in the table.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each library file's layer, lowest first. A file may use files of its
/// own layer or lower ones; the graph must also be free of cycles.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "core: pure rules and leaf utilities",
        &[
            "address.rs",
            "background.rs",
            "error.rs",
            "fencing.rs",
            "guard/health.rs",
            "guard/judge.rs",
            "guard/mod.rs",
            "health/breaker.rs",
            "keys.rs",
            "limits.rs",
            "quorum.rs",
            "retry.rs",
            "scripts/mod.rs",
            "wait/plan.rs",
        ],
    ),
    ("telemetry", &["telemetry.rs"]),
    (
        "state fed by requests",
        &["guard/watch.rs", "health/mod.rs"],
    ),
    (
        "wire",
        &[
            "connect.rs",
            "guard/observe.rs",
            "node.rs",
            "ops.rs",
            "round.rs",
            "storage.rs",
            "tls.rs",
            "wait/notify.rs",
        ],
    ),
    ("settings", &["config.rs"]),
    ("orchestration", &["engine.rs"]),
    (
        "public types",
        &[
            "fallback.rs",
            "lock.rs",
            "manager.rs",
            "many.rs",
            "read_write.rs",
            "wait/mod.rs",
            "watchdog.rs",
        ],
    ),
];

/// Trees outside the layering: the crate root, and the feature-gated
/// tools built on the public API.
const OUTSIDE: &[&str] = &["lib.rs", "bench/", "bin/", "testkit/"];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn library_files(dir: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).expect("src/ is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            library_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let name = path
                .strip_prefix(src())
                .expect("under src/")
                .to_string_lossy()
                .replace('\\', "/");
            if !OUTSIDE.iter().any(|o| name == *o || name.starts_with(o)) {
                out.push(name);
            }
        }
    }
}

/// The code of a file without its unit tests and comment lines.
fn code_of(text: &str) -> String {
    let text = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
    text.lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every module path a `crate::…` use names, as segments: a grouped
/// import `crate::a::{b::C, d}` yields `[a, b]` and `[a, d]`.
fn crate_paths(code: &str) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        let mut prefix = Vec::new();
        let mut tail = rest;
        loop {
            let end = tail
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            let segment = &tail[..end];
            tail = &tail[end..];
            if !segment.is_empty() {
                prefix.push(segment.to_owned());
            }
            if let Some(next) = tail.strip_prefix("::") {
                tail = next;
                if let Some(group) = tail.strip_prefix('{') {
                    let close = matching_brace(group);
                    for item in split_top_level(&group[..close]) {
                        let mut path = prefix.clone();
                        path.extend(
                            item.split("::")
                                .map(str::trim)
                                .take_while(|s| !s.is_empty() && !s.contains('{'))
                                .map(str::to_owned),
                        );
                        paths.push(path);
                    }
                    break;
                }
                continue;
            }
            paths.push(prefix);
            break;
        }
    }
    paths
}

fn matching_brace(text: &str) -> usize {
    let mut depth = 0;
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => return i,
            '}' => depth -= 1,
            _ => {}
        }
    }
    text.len()
}

fn split_top_level(text: &str) -> Vec<&str> {
    let (mut items, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&text[start..]);
    items
}

/// The file a module path lands in: its longest prefix that is a file.
fn file_of(path: &[String], files: &BTreeSet<String>) -> Option<String> {
    (1..=path.len()).rev().find_map(|n| {
        let base = path[..n].join("/");
        [format!("{base}.rs"), format!("{base}/mod.rs")]
            .into_iter()
            .find(|candidate| files.contains(candidate))
    })
}

fn dependencies() -> BTreeMap<String, BTreeSet<String>> {
    let mut names = Vec::new();
    library_files(&src(), &mut names);
    let files: BTreeSet<String> = names.iter().cloned().collect();
    let mut graph = BTreeMap::new();
    for name in &names {
        let code = code_of(&std::fs::read_to_string(src().join(name)).expect("readable"));
        let mut uses: BTreeSet<String> = crate_paths(&code)
            .iter()
            .filter_map(|path| file_of(path, &files))
            .collect();
        // `super::x` in a submodule names a sibling file.
        if let Some((dir, _)) = name.rsplit_once('/') {
            for part in code.split("super::").skip(1) {
                let module: String = part
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                let sibling = format!("{dir}/{module}.rs");
                if files.contains(&sibling) {
                    uses.insert(sibling);
                }
            }
        }
        uses.remove(name);
        graph.insert(name.clone(), uses);
    }
    graph
}

fn layer_of(file: &str) -> Option<usize> {
    LAYERS.iter().position(|(_, files)| files.contains(&file))
}

#[test]
fn the_parser_reads_grouped_and_nested_imports() {
    let paths =
        crate_paths("use crate::a::{b::C, d, e::{F, G}};\nlet x = crate::h::i(1);\nuse crate::j;");
    let as_strings: Vec<String> = paths.iter().map(|p| p.join("::")).collect();
    assert_eq!(
        as_strings,
        ["a::b::C", "a::d", "a::e", "h::i", "j"],
        "parsed {paths:?}"
    );
}

#[test]
fn every_library_file_has_a_layer() {
    let graph = dependencies();
    let unplaced: Vec<&String> = graph.keys().filter(|f| layer_of(f).is_none()).collect();
    assert!(
        unplaced.is_empty(),
        "files missing from the LAYERS table of tests/layout.rs: {unplaced:?}"
    );
    let listed: BTreeSet<&str> = LAYERS.iter().flat_map(|(_, f)| f.iter().copied()).collect();
    let gone: Vec<&&str> = listed.iter().filter(|f| !graph.contains_key(**f)).collect();
    assert!(
        gone.is_empty(),
        "LAYERS lists files that do not exist: {gone:?}"
    );
}

#[test]
fn dependencies_point_down_the_layers() {
    let graph = dependencies();
    let mut upward = Vec::new();
    for (file, uses) in &graph {
        let Some(from) = layer_of(file) else { continue };
        for used in uses {
            if let Some(to) = layer_of(used).filter(|&to| to > from) {
                upward.push(format!(
                    "{file} ({}) uses {used} ({})",
                    LAYERS[from].0, LAYERS[to].0
                ));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "dependencies pointing up:\n{}",
        upward.join("\n")
    );
}

#[test]
fn no_files_depend_on_each_other_in_a_circle() {
    let graph = dependencies();
    // Depth-first search; a file met again while still on the path closes
    // a cycle, which is reported as that path.
    fn visit<'a>(
        file: &'a str,
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|f| *f == file) {
            let mut cycle: Vec<String> = path[at..].iter().map(|f| f.to_string()).collect();
            cycle.push(file.to_owned());
            return Some(cycle);
        }
        if !done.insert(file) {
            return None;
        }
        path.push(file);
        for used in graph.get(file).into_iter().flatten() {
            if let Some(cycle) = visit(used, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    for file in graph.keys() {
        let cycle = visit(file, &graph, &mut Vec::new(), &mut done);
        assert!(
            cycle.is_none(),
            "files depend on each other in a circle: {}",
            cycle.unwrap().join(" -> ")
        );
    }
}
