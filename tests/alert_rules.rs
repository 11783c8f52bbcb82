//! The Prometheus alert rules (docs/prometheus) are valid,
//! do what their unit tests say (`promtool test rules`), use only metrics
//! this crate records, and are the ones docs/guide.md describes (by name,
//! with a link to the file rather than a copy of it).

use std::path::Path;
use std::process::Command;

use quorumlock::metric_names::ALL;
use yaml_rust2::YamlLoader;

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/prometheus");
const RULES: &str = "quorumlock-alerts.yml";
const RULE_TESTS: &str = "quorumlock-alerts.test.yml";

fn promtool(args: &[&str]) -> String {
    let output = Command::new("promtool")
        .args(args)
        .current_dir(DIR)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run promtool ({e}); it checks the alert rules. Install it: \
                 `apt-get install prometheus` (Debian/Ubuntu) or from prometheus.io"
            )
        });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

#[test]
fn the_rules_pass_promtool_and_their_unit_tests() {
    let checked = promtool(&["check", "rules", RULES]);
    assert!(checked.contains("SUCCESS: 4 rules found"), "{checked}");
    let tested = promtool(&["test", "rules", RULE_TESTS]);
    assert!(tested.contains("SUCCESS"), "{tested}");
}

#[test]
fn the_rules_use_only_metrics_this_crate_records() {
    let text = std::fs::read_to_string(Path::new(DIR).join(RULES)).expect("rules file");
    let docs = YamlLoader::load_from_str(&text).expect("valid YAML");
    let rules = &docs[0]["groups"][0]["rules"];
    let alerts: Vec<&str> = rules
        .as_vec()
        .expect("a list of rules")
        .iter()
        .map(|rule| rule["alert"].as_str().expect("an alert name"))
        .collect();
    assert_eq!(
        alerts,
        [
            "QuorumlockUnavailable",
            "QuorumlockDegraded",
            "QuorumlockLockWaitP99High",
            "QuorumlockLockLost"
        ]
    );
    for rule in rules.as_vec().expect("rules") {
        let expr = rule["expr"].as_str().expect("an expression");
        let used: Vec<&str> = expr
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|word| word.starts_with("quorumlock_"))
            .collect();
        assert!(!used.is_empty(), "{expr}");
        for name in used {
            // A histogram is exported as `_bucket`, `_sum` and `_count` series.
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .unwrap_or(name);
            assert!(ALL.contains(&base), "{name} in `{expr}` is not recorded");
        }
    }
}

/// The name of every alert in the rules file, in every group.
fn alert_names() -> Vec<String> {
    let text = std::fs::read_to_string(Path::new(DIR).join(RULES)).expect("rules file");
    let docs = YamlLoader::load_from_str(&text).expect("valid YAML");
    let groups = docs[0]["groups"].as_vec().expect("a list of groups");
    groups
        .iter()
        .flat_map(|group| group["rules"].as_vec().expect("a list of rules"))
        .filter_map(|rule| rule["alert"].as_str().map(str::to_owned))
        .collect()
}

#[test]
fn the_guide_names_every_rule_and_links_the_file() {
    let guide = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/guide.md"))
        .expect("docs/guide.md");
    let alerts = alert_names();
    assert!(!alerts.is_empty(), "no alerts in docs/prometheus/{RULES}");
    let unnamed: Vec<&String> = alerts
        .iter()
        .filter(|name| !guide.contains(&format!("`{name}`")))
        .collect();
    assert!(
        unnamed.is_empty(),
        "docs/guide.md (Alerting) must describe every alert of docs/prometheus/{RULES}; \
         missing: {unnamed:?}"
    );
    // And name no alert the file no longer has.
    let stale: Vec<&str> = guide
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|word| word.starts_with("Quorumlock") && !alerts.iter().any(|a| a == word))
        .collect();
    assert!(
        stale.is_empty(),
        "docs/guide.md names alerts that docs/prometheus/{RULES} lacks: {stale:?}"
    );
    assert!(
        guide.contains(&format!("](prometheus/{RULES})")),
        "docs/guide.md must link docs/prometheus/{RULES} (relative link `prometheus/{RULES}`)"
    );
}
