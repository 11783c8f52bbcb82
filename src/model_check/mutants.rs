//! The mutant suite: defects planted one at a time in copies of the
//! scripts (or in the model's guard rule), each of which the model check
//! must find. A mutant the check does not kill is a hole in the evidence
//! behind "no two holders"; the suite makes "the check covers X" a
//! measured claim (`killed N of N`, with each counterexample's length).
//!
//! A patch that no longer finds its text fails the suite: a mutant whose
//! code moved must be written again, not pass unseen.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::guard::Rule;
use super::wire::{self, Patch, Scripts};
use super::world::{News, Scenario, TokenRule};
use super::{A, B};
use super::{
    at_least, counter_node_ahead, counter_node_cut_off, holder_and_waiter,
    kept_keys_and_a_newcomer, kept_keys_and_an_extension, kept_keys_outlive_validity,
    keys_outlive_validity, late_extension, nested, quorum_fencing, readers_and_a_waiting_writer,
    restarts, restarts_with, run, three_kinds, two_resources_and_reader, wake_ups,
    wake_ups_on_three_nodes, wake_ups_with_a_give_up, zombie_write,
};

/// How a mutant is made from the library.
enum Plant {
    /// Changes to the scripts' sources.
    Scripts(&'static [Patch]),
    /// `acquire.lua` replaced by a frozen copy of an earlier version.
    Acquire(&'static str),
    /// The guard's rule replaced.
    Rule(Rule),
    /// The rule of which rings wake a waiter replaced.
    News(News),
    /// The counter-node token rule replaced.
    Token(TokenRule),
}

/// A planted defect and the scenario that must find it.
struct Mutant {
    name: &'static str,
    plant: Plant,
    /// The scenario, run with the mutant's scripts and rule.
    scenario: fn() -> Scenario,
}

const fn patch(find: &'static str, replace: &'static str) -> Patch {
    Patch { find, replace }
}

/// The keys of a lock set to live `$ms` less than its TTL, wherever a
/// script sets them (a plain `SET NX PX` sent as a command is not a
/// script: the scenario's holder waits, so its keys come from scripts).
macro_rules! short_keys {
    ($ms:literal) => {
        &[
            patch(
                r#"redis.call("SET", lock, value, "NX", "PX", ttl)"#,
                concat!(
                    r#"redis.call("SET", lock, value, "NX", "PX", ttl - "#,
                    $ms,
                    ")"
                ),
            ),
            patch(
                r#"redis.call("SET", KEYS[1], ARGV[1], "NX", "PX", ARGV[2])"#,
                concat!(
                    r#"redis.call("SET", KEYS[1], ARGV[1], "NX", "PX", ARGV[2] - "#,
                    $ms,
                    ")"
                ),
            ),
            patch(
                r#"redis.call("SET", lock, value, "PX", ttl)"#,
                concat!(r#"redis.call("SET", lock, value, "PX", ttl - "#, $ms, ")"),
            ),
        ]
    };
}

fn old_acquire_nested() -> Scenario {
    nested("nested, old acquire.lua", A, B, Scripts::library())
}

fn restarts_old_rule() -> Scenario {
    restarts(Rule::BeforeFix)
}

fn restarts_met_late_old_rule() -> Scenario {
    restarts_with(
        "restarts, B meets the nodes late",
        Rule::BeforeFix,
        false,
        &["B"],
    )
}

/// Every mutant, with the scenario that kills it.
const MUTANTS: &[Mutant] = &[
    Mutant {
        name: "a writer ignores readers already holding",
        plant: Plant::Scripts(&[patch(
            r#"    if kind ~= "none" and not (kind == "zset" and access == "r") then"#,
            r#"    if kind == "string" then"#,
        )]),
        scenario: two_resources_and_reader,
    },
    Mutant {
        name: "the fencing counter is never incremented",
        plant: Plant::Scripts(&[patch(
            r#"    redis.call("INCR", key)"#,
            r#"    redis.call("GET", key)"#,
        )]),
        scenario: holder_and_waiter,
    },
    Mutant {
        name: "store_token.lua never raises the counters (quorum-mode fencing)",
        plant: Plant::Scripts(&[patch(
            r#"    redis.call("SET", key, ARGV[2])"#,
            r#"    redis.call("GET", key)"#,
        )]),
        scenario: quorum_fencing,
    },
    Mutant {
        name: "keep.lua keeps an at_least lock's keys 1 s short",
        plant: Plant::Scripts(&[
            patch(r#"if left < 0 or left > keep then"#, r#"if true then"#),
            patch(
                r#"redis.call("PEXPIRE", lock, keep)"#,
                r#"redis.call("PEXPIRE", lock, keep - 1000)"#,
            ),
        ]),
        scenario: at_least,
    },
    Mutant {
        name: "release_fast.lua deletes the key without checking it owns it",
        plant: Plant::Scripts(&[patch(
            r#"            if v == value then"#,
            r#"            if v then"#,
        )]),
        scenario: three_kinds,
    },
    Mutant {
        name: "keys set to TTL - 1100 ms",
        plant: Plant::Scripts(short_keys!("1100")),
        scenario: keys_outlive_validity,
    },
    Mutant {
        name: "keys set to TTL - 900 ms",
        plant: Plant::Scripts(short_keys!("900")),
        scenario: keys_outlive_validity,
    },
    Mutant {
        name: "extend.lua writes its own value over another client's key",
        plant: Plant::Scripts(&[patch(
            "            missing = true\n        else\n            return 0\n        end",
            "            missing = true\n        else\n            missing = true\n        end",
        )]),
        scenario: late_extension,
    },
    Mutant {
        name: "a multi-resource lock checked and extended on its first resource only",
        plant: Plant::Scripts(&[
            patch(
                "for i = 0, resources - 1 do\n        local lock = lock_of(i)\n        -- Ours is the common case",
                "for i = 0, 0 do\n        local lock = lock_of(i)\n        -- Ours is the common case",
            ),
            patch(
                "for i = 0, resources - 1 do\n        local lock = lock_of(i)\n        if ours[i] and access",
                "for i = 0, 0 do\n        local lock = lock_of(i)\n        if ours[i] and access",
            ),
        ]),
        scenario: late_extension,
    },
    Mutant {
        name: "fence.lua accepts any token",
        plant: Plant::Scripts(&[patch(
            "    if below(offered, highest) then",
            "    if false then",
        )]),
        scenario: zombie_write,
    },
    Mutant {
        name: "fenced_read.lua does not claim its token",
        plant: Plant::Scripts(&[patch(
            "fence_claim(KEYS[1], highest, offered)\nif wanted == \"list\" then",
            "if wanted == \"list\" then",
        )]),
        scenario: zombie_write,
    },
    Mutant {
        name: "a queue does not keep the lock key (a newcomer's plain SET NX jumps ahead)",
        // `cover`, and the fast refusal, grant and release, which cover alike.
        plant: Plant::Scripts(&[
            patch(
                "local function cover(lock, q)\n",
                "local function cover(lock, q)\n    do return end\n",
            ),
            patch("if at >= 0 and at < until_ms then", "if false then"),
            patch(
                "local stays_plain = until_ms < 0 or at < 0 or at >= until_ms",
                "local stays_plain = true",
            ),
            patch(
                "    if until_ms >= 0 then\n        redis.call(\"SET\", lock, COVER",
                "    if false then\n        redis.call(\"SET\", lock, COVER",
            ),
        ]),
        scenario: wake_ups,
    },
    Mutant {
        name: "a key kept for the queue never expires",
        plant: Plant::Scripts(&[patch(
            r#"redis.call("SET", lock, COVER, "PXAT", until_ms)"#,
            r#"redis.call("SET", lock, COVER)"#,
        )]),
        scenario: wake_ups,
    },
    Mutant {
        name: "a key kept for the queue keeps its holder as long as the queue",
        // `cover`, and the fast refusal and grant, which cover alike.
        plant: Plant::Scripts(&[
            patch("v = v .. COVER .. at", "v = v .. COVER .. until_ms"),
            patch(
                r#"redis.call("SET", lock, v .. COVER .. at, "PXAT", until_ms)"#,
                r#"redis.call("SET", lock, v .. COVER .. until_ms, "PXAT", until_ms)"#,
            ),
            patch(
                r#"redis.call("SET", lock, value .. COVER .. at, "PXAT", until_ms)"#,
                r#"redis.call("SET", lock, value .. COVER .. until_ms, "PXAT", until_ms)"#,
            ),
        ]),
        scenario: wake_ups,
    },
    Mutant {
        name: "a key kept for the queue is given back 500 ms short",
        plant: Plant::Scripts(&[patch(
            r#"redis.call("SET", lock, owner, "PXAT", due)"#,
            r#"redis.call("SET", lock, owner, "PXAT", math.max(due - 500, now_ms() + 1))"#,
        )]),
        scenario: kept_keys_and_a_newcomer,
    },
    Mutant {
        name: "a winner's quiet dequeue deletes its key where no one else waits",
        plant: Plant::Scripts(&[patch(
            "                uncover(lock_of(i))",
            r#"                redis.call("DEL", lock_of(i))"#,
        )]),
        scenario: wake_ups,
    },
    Mutant {
        name: "a waiter refused behind a holder is not queued (the fast refusal)",
        plant: Plant::Scripts(&[patch(
            "    enqueue(q, ticket, waiter, lease_ms, now_ms(), \"x\")\n    -- `cover`, after",
            "    -- `cover`, after",
        )]),
        scenario: wake_ups,
    },
    Mutant {
        name: "any waiter takes a key kept for the queue, first or not (the fast grant)",
        plant: Plant::Scripts(&[patch(
            "(head[1] ~= waiter and before(head[1], tonumber(head[2]), ticket, waiter))",
            "false",
        )]),
        scenario: wake_ups,
    },
    Mutant {
        name: "a release of a key kept for the queue wakes no one (the fast release)",
        plant: Plant::Scripts(&[patch(
            "        wake_first(q, ARGV[4], true)\n    end)\n    local until_ms",
            "    end)\n    local until_ms",
        )]),
        scenario: wake_ups,
    },
    Mutant {
        name: "extend.lua works on kept keys as they are (not uncovered first)",
        plant: Plant::Scripts(&[patch(
            "return uncovered(function()\n    local value, ttl, repair, access",
            "return (function(body) return body() end)(function()\n    local value, ttl, repair, access",
        )]),
        scenario: kept_keys_and_an_extension,
    },
    Mutant {
        name: "a key kept for the queue is given back with the queue's time",
        plant: Plant::Scripts(&[patch(
            r#"redis.call("SET", lock, owner, "PXAT", due)"#,
            r#"redis.call("SET", lock, owner, "PXAT", redis.call("PEXPIRETIME", lock))"#,
        )]),
        scenario: kept_keys_outlive_validity,
    },
    Mutant {
        name: "readers ignore waiting writers (writers starve)",
        plant: Plant::Scripts(&[patch(
            "local function waiter_ahead(q, now, access, ticket, id)\n",
            "local function waiter_ahead(q, now, access, ticket, id)\n    if access == \"r\" then\n        return nil\n    end\n",
        )]),
        scenario: readers_and_a_waiting_writer,
    },
    Mutant {
        name: "a release sends no wake-up (no PUBLISH)",
        plant: Plant::Scripts(&[patch(
            r#"    redis.pcall("PUBLISH", channel, head[1])"#,
            r#"    local _ = channel"#,
        )]),
        scenario: wake_ups,
    },
    Mutant {
        name: "a release never removes the waiter from the queue",
        plant: Plant::Scripts(&[patch(
            r#"        local left = waiter ~= "" and dequeue(q, waiter, access)"#,
            r#"        local left = false"#,
        )]),
        scenario: wake_ups_with_a_give_up,
    },
    Mutant {
        name: "release.lua deletes a key it does not hold (the full release)",
        plant: Plant::Scripts(&[patch(
            "            if holds(lock, value, access) then\n                removed = true",
            "            if true then\n                removed = true",
        )]),
        scenario: three_kinds,
    },
    Mutant {
        name: "the counter node grants whatever its SET NX answered",
        plant: Plant::Scripts(&[patch(
            "if set_lone(KEYS[1], ARGV[1], ARGV[2]) then\n    return (issue(KEYS[2], counter))",
            "set_lone(KEYS[1], ARGV[1], ARGV[2])\nif true then\n    return (issue(KEYS[2], counter))",
        )]),
        scenario: holder_and_waiter,
    },
    Mutant {
        name: "a multi-resource waiter queued on every resource (acquire.lua before its fix)",
        plant: Plant::Acquire(wire::ACQUIRE_BEFORE_FIX),
        scenario: old_acquire_nested,
    },
    Mutant {
        name: "the guard judges a restart by the new process alone (the rule before its fix)",
        plant: Plant::Rule(Rule::BeforeFix),
        scenario: restarts_old_rule,
    },
    Mutant {
        name: "the rule before its fix, against a client that meets the nodes after the restart",
        plant: Plant::Rule(Rule::BeforeFix),
        scenario: restarts_met_late_old_rule,
    },
    Mutant {
        name: "after a ring that was no news, a waiter is woken by no ring",
        plant: Plant::News(News::NothingAfterAnEcho),
        scenario: wake_ups_on_three_nodes,
    },
    Mutant {
        name: "a waiter forgets the rings that came while its attempt was out",
        plant: Plant::News(News::AfterTheAnswer),
        scenario: wake_ups_on_three_nodes,
    },
    Mutant {
        name: "a token issued without the counter node is not above the counter node's last",
        plant: Plant::Token(TokenRule::NoClockFloor),
        scenario: counter_node_cut_off,
    },
    Mutant {
        name: "the counter node's token counts whatever the other nodes report",
        plant: Plant::Token(TokenRule::CounterNodeTrusted),
        scenario: counter_node_cut_off,
    },
    Mutant {
        name: "the counter node's token counts however far ahead its clock runs",
        plant: Plant::Token(TokenRule::NoCeiling),
        scenario: counter_node_ahead,
    },
];

/// What one mutant's run found: its counterexample's length and property,
/// or nothing (it survived); or why it could not be made.
type Found = Result<Option<Kill>, String>;

/// What one mutant's run found when killed.
struct Kill {
    steps: usize,
    property: String,
    states: usize,
}

fn try_to_kill(mutant: &Mutant) -> Found {
    let library = Scripts::library();
    let scenario = (mutant.scenario)();
    let scenario = match mutant.plant {
        Plant::Scripts(patches) => Scenario {
            scripts: Scripts::patched(patches)?,
            ..scenario
        },
        Plant::Acquire(source) => Scenario {
            scripts: library.with_acquire(source),
            ..scenario
        },
        Plant::Rule(rule) => Scenario { rule, ..scenario },
        Plant::News(news) => Scenario { news, ..scenario },
        Plant::Token(token_rule) => Scenario {
            token_rule,
            ..scenario
        },
    };
    let report = run(scenario);
    Ok(report.violation.map(|v| Kill {
        steps: v.steps,
        property: v.property,
        states: report.states,
    }))
}

/// Every mutant is killed: the model check finds a violated property in
/// its scenario. Two at a time (each model is single-threaded).
#[test]
fn the_model_check_kills_every_mutant() {
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<(usize, Found)>> = Mutex::default();
    std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(mutant) = MUTANTS.get(i) else { break };
                    let found = try_to_kill(mutant);
                    results.lock().expect("no worker panicked").push((i, found));
                }
            });
        }
    });
    let mut results = results.into_inner().expect("no worker panicked");
    results.sort_by_key(|(i, _)| *i);
    let mut killed = 0;
    let mut lines = Vec::new();
    for (i, found) in &results {
        let name = MUTANTS[*i].name;
        lines.push(match found {
            Ok(Some(kill)) => {
                killed += 1;
                format!(
                    "killed   {name}: {} steps ({} states): {}",
                    kill.steps,
                    kill.states,
                    kill.property.lines().next().unwrap_or_default()
                )
            }
            Ok(None) => format!("SURVIVED {name}"),
            Err(error) => format!("BROKEN   {name}: {error}"),
        });
    }
    let score = format!("killed {killed} of {}", MUTANTS.len());
    eprintln!("mutant suite: {score}\n    {}", lines.join("\n    "));
    assert_eq!(
        killed,
        MUTANTS.len(),
        "the model check let mutants through ({score}):\n    {}",
        lines.join("\n    ")
    );
}
