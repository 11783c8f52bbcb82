//! The library's files depend on each other in one direction only: from
//! the public types, through the orchestration and the wire, down to the
//! pure core. This test reads every `crate::` and `super::` path in
//! `src/` (outside `#[cfg(test)]` modules and comments), maps it to the
//! file it names, and checks each edge against the layer table below and
//! the whole graph for cycles. A new file must be placed in the table.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each library file's layer, lowest first. A file may use files of its
/// own layer or lower ones; the graph must also be free of cycles. A
/// `mod.rs` that re-exports its children sits at least as high as they
/// do, so code below imports from the file that defines an item.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "core: pure rules and leaf utilities",
        &[
            "address.rs",
            "background.rs",
            "clock.rs",
            "error.rs",
            "fencing.rs",
            "guard/findings.rs",
            "guard/health.rs",
            "guard/judge.rs",
            "guard/policy.rs",
            "health/breaker.rs",
            "holding.rs",
            "keys.rs",
            "kind.rs",
            "limits.rs",
            "pending.rs",
            "quorum.rs",
            "resp.rs",
            "retry.rs",
            "scripts/mod.rs",
            "slots.rs",
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
            "hot_wire.rs",
            "member.rs",
            "node.rs",
            "ops.rs",
            "reply_error.rs",
            "round.rs",
            "storage.rs",
            "tls.rs",
            "wait/notify.rs",
        ],
    ),
    ("settings", &["config.rs"]),
    ("orchestration", &["engine.rs", "held.rs"]),
    (
        "public types",
        &[
            "election.rs",
            "fallback.rs",
            "guard/mod.rs",
            "inspect.rs",
            "lock.rs",
            "manager.rs",
            "many.rs",
            "read_write.rs",
            "request.rs",
            "wait/mod.rs",
            "watchdog.rs",
        ],
    ),
];

/// Trees outside the layering: the crate root, and the feature-gated
/// tools built on the public API.
const OUTSIDE: &[&str] = &["lib.rs", "bench/", "bin/", "model_check/", "testkit/"];

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

/// The module path of a library file: `a/b.rs` → `[a, b]`, `a/mod.rs` →
/// `[a]`.
fn module_of(file: &str) -> Vec<String> {
    let stem = file.strip_suffix(".rs").unwrap_or(file);
    let stem = stem.strip_suffix("/mod").unwrap_or(stem);
    stem.split('/').map(str::to_owned).collect()
}

/// The modules a file declares with `mod x;` (its child files).
fn child_modules(code: &str) -> Vec<String> {
    code.lines()
        .filter_map(|line| {
            let line = line.trim();
            let rest = line
                .strip_prefix("pub(crate) mod ")
                .or_else(|| line.strip_prefix("pub mod "))
                .or_else(|| line.strip_prefix("mod "))?;
            rest.strip_suffix(';').map(str::to_owned)
        })
        .collect()
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Every module path the code of `file` names, from the crate root:
/// `crate::…`, `super::…` (nested too), `self::…`, and `use child::…` of
/// its own child modules, each with grouped imports (`a::{b::C, d}`)
/// expanded, across lines.
fn named_paths(file: &str, code: &str) -> Vec<Vec<String>> {
    // `super::` goes up from here (for `a/mod.rs`, module `a`).
    let here = module_of(file);
    let children = child_modules(code);
    let mut paths = Vec::new();
    let chars: Vec<(usize, char)> = code.char_indices().collect();
    for (n, &(at, _)) in chars.iter().enumerate() {
        // A path starts where no identifier or `::` comes just before.
        let before = n.checked_sub(1).map(|p| chars[p].1);
        if before.is_some_and(|c| is_ident(c) || c == ':') {
            continue;
        }
        let rest = &code[at..];
        let (mut base, mut tail) = if let Some(tail) = rest.strip_prefix("crate::") {
            (Vec::new(), tail)
        } else if let Some(tail) = rest.strip_prefix("self::") {
            (here.clone(), tail)
        } else if rest.starts_with("super::") {
            let mut base = here.clone();
            let mut tail = rest;
            while let Some(next) = tail.strip_prefix("super::") {
                base.pop();
                tail = next;
            }
            (base, tail)
        } else if let Some((child, tail)) = children.iter().find_map(|child| {
            let tail = rest.strip_prefix(child.as_str())?.strip_prefix("::")?;
            code[..at]
                .trim_end()
                .ends_with("use")
                .then_some((child, tail))
        }) {
            let mut base = here.clone();
            base.push(child.clone());
            (base, tail)
        } else {
            continue;
        };
        tail = tail.trim_start();
        parse_tree(tail, &mut base, &mut paths);
    }
    paths
}

/// Reads one path or group at the start of `text` under `prefix`.
fn parse_tree(text: &str, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    let depth = prefix.len();
    let mut tail = text;
    loop {
        tail = tail.trim_start();
        if let Some(group) = tail.strip_prefix('{') {
            let close = matching_brace(group);
            for item in split_top_level(&group[..close]) {
                if !item.trim().is_empty() {
                    parse_tree(item, prefix, out);
                }
            }
            break;
        }
        let end = tail.find(|c: char| !is_ident(c)).unwrap_or(tail.len());
        let segment = &tail[..end];
        if !segment.is_empty() && segment != "self" {
            prefix.push(segment.to_owned());
        }
        tail = &tail[end..];
        match tail.strip_prefix("::") {
            Some(next) => tail = next,
            None => {
                out.push(prefix.clone());
                break;
            }
        }
    }
    prefix.truncate(depth);
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

/// Each library file, and the files it uses; also the paths that name no
/// file (through the crate root's re-exports, say), by file.
fn graph() -> (BTreeMap<String, BTreeSet<String>>, Vec<String>) {
    let mut names = Vec::new();
    library_files(&src(), &mut names);
    let files: BTreeSet<String> = names.iter().cloned().collect();
    let mut graph = BTreeMap::new();
    let mut unresolved = Vec::new();
    for name in &names {
        let code = code_of(&std::fs::read_to_string(src().join(name)).expect("readable"));
        let mut uses = BTreeSet::new();
        for path in named_paths(name, &code) {
            match file_of(&path, &files) {
                Some(file) => {
                    uses.insert(file);
                }
                // Paths into the trees outside the layering are not edges.
                None if path
                    .first()
                    .is_some_and(|m| OUTSIDE.iter().any(|o| o.trim_end_matches('/') == m)) => {}
                None => unresolved.push(format!("{name}: crate::{}", path.join("::"))),
            }
        }
        uses.remove(name);
        graph.insert(name.clone(), uses);
    }
    (graph, unresolved)
}

fn dependencies() -> BTreeMap<String, BTreeSet<String>> {
    graph().0
}

fn layer_of(file: &str) -> Option<usize> {
    LAYERS.iter().position(|(_, files)| files.contains(&file))
}

#[test]
fn the_parser_reads_every_form_of_import() {
    let code = "use crate::a::{b::C, d, e::{F, g::H}};\n\
                use crate::{i::J, k};\n\
                let x = crate::l::m(1);\n\
                use super::{n::O, P};\n\
                use super::super::q::R;\n\
                use self::s::T;\n\
                mod child;\n\
                pub use child::{U, deeper::V};\n\
                use crate::w::{\n    X,\n    y::Z,\n};";
    let as_strings: Vec<String> = named_paths("top/mid/leaf.rs", code)
        .iter()
        .map(|p| p.join("::"))
        .collect();
    let expected = [
        "a::b::C",
        "a::d",
        "a::e::F",
        "a::e::g::H",
        "i::J",
        "k",
        "l::m",
        "top::mid::n::O",
        "top::mid::P",
        "top::q::R",
        "top::mid::leaf::s::T",
        "top::mid::leaf::child::U",
        "top::mid::leaf::child::deeper::V",
        "w::X",
        "w::y::Z",
    ];
    assert_eq!(as_strings, expected, "parsed");
    // In a `mod.rs`, `super::` is the directory's parent.
    let in_mod: Vec<String> = named_paths("top/mod.rs", "use super::a::B;")
        .iter()
        .map(|p| p.join("::"))
        .collect();
    assert_eq!(in_mod, ["a::B"]);
}

#[test]
fn library_code_imports_from_the_defining_file() {
    let (_, unresolved) = graph();
    assert!(
        unresolved.is_empty(),
        "paths that name no library file (import from the module that defines the item, not \\
         through the crate root): {unresolved:?}"
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

const ARCHITECTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/architecture.md");
const LAYERS_BEGIN: &str = "<!-- layers:begin -->";
const LAYERS_END: &str = "<!-- layers:end -->";
/// Where the paths the architecture doc names start.
const TOP_DIRS: &[&str] = &[
    "src/",
    "tests/",
    "benches/",
    "examples/",
    "docs/",
    "docker/",
];

/// The layer table of docs/architecture.md, rendered from `LAYERS` and
/// `OUTSIDE`, highest layer first.
fn layer_table() -> String {
    let code = |files: &[&str]| {
        files
            .iter()
            .map(|f| format!("`{f}`"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut table = String::from("| layer (highest first) | files in `src/` |\n| --- | --- |\n");
    for (layer, files) in LAYERS.iter().rev() {
        table += &format!("| {layer} | {} |\n", code(files));
    }
    table += &format!("| outside the layers | {} |\n", code(OUTSIDE));
    table
}

#[test]
fn the_architecture_doc_shows_the_layer_table() {
    let doc = std::fs::read_to_string(ARCHITECTURE).expect("docs/architecture.md");
    let (before, rest) = doc
        .split_once(LAYERS_BEGIN)
        .unwrap_or_else(|| panic!("docs/architecture.md lacks the line {LAYERS_BEGIN}"));
    let (current, after) = rest
        .split_once(LAYERS_END)
        .unwrap_or_else(|| panic!("docs/architecture.md lacks the line {LAYERS_END}"));
    let expected = format!("\n{}", layer_table());
    if current == expected {
        return;
    }
    if std::env::var_os("QUORUMLOCK_BLESS").is_some_and(|v| v == "1") {
        let blessed = format!("{before}{LAYERS_BEGIN}{expected}{LAYERS_END}{after}");
        std::fs::write(ARCHITECTURE, blessed).expect("docs/architecture.md is writable");
        return;
    }
    panic!(
        "the layer table of docs/architecture.md differs from LAYERS and OUTSIDE in \
         tests/layout.rs; it should read:\n\n{LAYERS_BEGIN}{expected}{LAYERS_END}\n\n\
         Run `QUORUMLOCK_BLESS=1 cargo test --test layout` to rewrite that section."
    );
}

#[test]
fn every_path_the_architecture_doc_names_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(ARCHITECTURE).expect("docs/architecture.md");
    let is_path = |c: char| c.is_alphanumeric() || "_-./".contains(c);
    let mut missing = Vec::new();
    let mut named = 0;
    for (at, _) in doc.char_indices() {
        // A path starts where no path character comes just before.
        if doc[..at].chars().next_back().is_some_and(is_path) {
            continue;
        }
        let rest = &doc[at..];
        if !TOP_DIRS.iter().any(|top| rest.starts_with(top)) {
            continue;
        }
        let end = rest.find(|c| !is_path(c)).unwrap_or(rest.len());
        // A path ending a sentence keeps its slash but not the full stop.
        let path = rest[..end].trim_end_matches('.');
        named += 1;
        if !root.join(path).exists() {
            missing.push(path);
        }
    }
    assert!(
        named > 0,
        "docs/architecture.md names no path: is this the right file?"
    );
    assert!(
        missing.is_empty(),
        "docs/architecture.md names paths that do not exist: {missing:?}"
    );
}

/// `LockManager` stays small enough to learn in one sitting: at most 15
/// public methods across its `impl` blocks (a variant of an operation is
/// an argument of it, as `force_unlock(Break::…)` is, not a method more).
#[test]
fn the_lock_manager_has_at_most_15_public_methods() {
    let mut files = Vec::new();
    library_files(&src(), &mut files);
    let mut methods = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(src().join(file)).expect("readable");
        let code = code_of(&text);
        for (at, _) in code.match_indices("impl LockManager {") {
            let body_start = at + "impl LockManager {".len();
            let body = &code[body_start..body_start + matching_brace(&code[body_start..])];
            for line in body.lines() {
                let line = line.trim_start();
                let signature = line
                    .strip_prefix("pub async fn ")
                    .or_else(|| line.strip_prefix("pub fn "));
                if let Some(rest) = signature {
                    let name: String = rest.chars().take_while(|&c| is_ident(c)).collect();
                    methods.push(format!("{file}: {name}"));
                }
            }
        }
    }
    assert!(methods.len() >= 10, "methods read: {methods:?}");
    assert!(
        methods.len() <= 15,
        "LockManager has {} public methods: {methods:#?}",
        methods.len()
    );
}
