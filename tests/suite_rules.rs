//! The suite's rule for the managers tests build (see `common::slowdown`):
//! setup goes through `common::builder`, whose timeouts a loaded machine
//! meets; a test that builds its own manager or sets `node_timeout` says
//! why in a `timing:` or `settings:` comment at most a few lines above. A
//! 50 ms default in a setup step failed CI runs one test at a time; this
//! keeps the class from coming back.

use std::path::Path;

/// How far above the call its reason may be.
const LINES_ABOVE: usize = 12;

/// What a test may only do with a reason given.
const NEEDS_A_REASON: [&str; 2] = ["LockManager::builder()", ".node_timeout("];

#[test]
fn every_manager_a_test_builds_goes_through_the_helper_or_says_why() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let mut unexplained = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("tests/")
        .map(|entry| entry.expect("an entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "rs"))
        .collect();
    files.sort();
    for path in &files {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if name == "suite_rules.rs" {
            continue;
        }
        let text = std::fs::read_to_string(path).expect("readable");
        unexplained.extend(unexplained_in(name, &text));
    }
    assert!(
        !files.is_empty() && unexplained.is_empty(),
        "managers built outside `common::builder`, or with a node_timeout, without a `timing:` \
         or `settings:` comment at most {LINES_ABOVE} lines above saying why:\n  {}",
        unexplained.join("\n  ")
    );
}

/// The lines of `text` (the file `name`) that need a reason and give none.
fn unexplained_in(name: &str, text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    lines
        .iter()
        .enumerate()
        .filter(|(_, line)| NEEDS_A_REASON.iter().any(|call| line.contains(call)))
        .filter(|(at, _)| {
            !lines[at.saturating_sub(LINES_ABOVE)..=*at]
                .iter()
                .any(|line| line.contains("// timing:") || line.contains("// settings:"))
        })
        .map(|(at, line)| format!("{name}:{}: {}", at + 1, line.trim()))
        .collect()
}

/// The check bites: a bare builder is caught, one with a reason is not.
#[test]
fn the_rule_catches_a_bare_builder() {
    let bare = "let m = LockManager::builder()\n    .nodes(urls)\n    .build();";
    assert_eq!(unexplained_in("x.rs", bare).len(), 1);
    let timeout = "let m = common::builder(urls)\n    .node_timeout(ms(50))\n    .build();";
    assert_eq!(unexplained_in("x.rs", timeout).len(), 1);
    let said = "// timing: what the 50 ms default does is the subject\nlet m = \
                LockManager::builder();";
    assert!(unexplained_in("x.rs", said).is_empty());
}
