//! `quorumlock break NAME`: force-unlock a resource, for an operator whose
//! holder is stuck. Asks first (or `--yes`), then deletes the lock on every
//! node and says which token the next holder's will exceed.

use std::io::{BufRead, IsTerminal, Write};

use clap::Args;

use crate::status::shown_holder;
use crate::{Failure, NodeArgs, exit};

#[derive(Args)]
pub struct BreakArgs {
    /// The resource whose lock to break.
    resource: String,
    #[command(flatten)]
    nodes: NodeArgs,
    /// Bound on each node's reply.
    #[arg(long, default_value = crate::DEFAULT_NODE_TIMEOUT.as_str(), value_parser = crate::duration)]
    node_timeout: std::time::Duration,
    /// Do not ask for confirmation (needed without a terminal). Breaks
    /// whoever holds the lock when it runs.
    #[arg(short, long)]
    yes: bool,
}

pub async fn break_lock(args: BreakArgs) -> Result<u8, Failure> {
    let manager = args
        .nodes
        .builder()?
        .node_timeout(args.node_timeout)
        .build()?;
    // Who holds it, as far as the nodes the node guard counts can tell (a
    // break goes to every node, counted or not).
    let shown = match manager.holders(&args.resource).await {
        Ok(holding) => {
            show(&args.resource, &holding);
            Some(holders_of(&holding))
        }
        Err(error) => {
            println!(
                "who holds `{}` cannot be told: {}",
                crate::printable(&args.resource),
                crate::printable(&error.to_string())
            );
            None
        }
    };
    if !args.yes {
        if !confirmed(&args.resource)? {
            println!("not broken");
            return Ok(exit::FAILED);
        }
        // The operator confirmed what was shown: not another holder that
        // got the lock meanwhile.
        let now = manager.holders(&args.resource).await.ok();
        if shown.is_some() && now.as_ref().map(holders_of) != shown {
            println!("not broken: the holders changed since they were shown; run it again");
            return Ok(exit::FAILED);
        }
    }
    let broken = manager.force_unlock(&args.resource).await?;
    println!(
        "broken: the lock key was deleted on {} of {} nodes ({} answered)",
        broken.deleted, broken.nodes, broken.answered
    );
    match broken.counter {
        Some(counter) => println!(
            "the broken holder's token is at most {counter}; the next holder's is higher, and \
             once it has written, storage that checks tokens refuses the broken holder's writes"
        ),
        None => println!("the resource has no fencing counter: its holders had no tokens"),
    }
    println!("the broken holder learns of it at its next extension (lost) or release (not held)");
    Ok(0)
}

/// Prints who holds `resource`.
fn show(resource: &str, holding: &quorumlock::Holding) {
    let resource = crate::printable(resource);
    if holding.holders.is_empty() {
        let keys_left = if holding.free {
            ""
        } else {
            " (some nodes hold a key: breaking clears them)"
        };
        println!("`{resource}` is not held by a quorum{keys_left}");
    }
    for holder in &holding.holders {
        println!(
            "`{resource}` is held by {} ({:?}, on {} of {} nodes)",
            shown_holder(&holder.value),
            holder.kind,
            holder.nodes,
            holding.nodes
        );
    }
}

/// The holders' values, sorted: what the operator was shown.
fn holders_of(holding: &quorumlock::Holding) -> Vec<String> {
    let mut values: Vec<String> = holding.holders.iter().map(|h| h.value.clone()).collect();
    values.sort_unstable();
    values
}

/// Asks on the terminal; without one, refuses (the caller gives `--yes`).
fn confirmed(resource: &str) -> Result<bool, Failure> {
    if !std::io::stdin().is_terminal() {
        return Err(Failure::new(
            exit::USAGE,
            "no terminal to confirm on: pass --yes to break the lock",
        ));
    }
    print!("break the lock on `{}`? [y/N] ", crate::printable(resource));
    std::io::stdout()
        .flush()
        .map_err(|e| Failure::new(exit::ERROR, e.to_string()))?;
    let mut answer = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut answer)
        .map_err(|e| Failure::new(exit::ERROR, e.to_string()))?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes"))
}
