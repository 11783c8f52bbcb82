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
    /// the holders it shows, and nothing else: a holder that took the
    /// lock since, or that it met mid-acquire, keeps it.
    #[arg(short, long)]
    yes: bool,
    /// Break whoever holds the lock when the break runs, also keys on
    /// fewer nodes than a quorum (a failed attempt's, that did not expire)
    /// and a holder that took the lock after the read: only for a lock
    /// nobody can be shown holding.
    #[arg(long)]
    any_holder: bool,
}

pub async fn break_lock(args: BreakArgs) -> Result<u8, Failure> {
    let manager = args
        .nodes
        .builder()?
        .node_timeout(args.node_timeout)
        .build()?;
    // Who holds it, as far as the nodes the node guard counts can tell (a
    // break goes to every node, counted or not). What is shown is what is
    // broken, and nothing else: a holder that takes the lock after this
    // read (the one shown released it meanwhile) keeps it.
    let shown = manager.holders(&args.resource).await.map_err(|error| {
        Failure::new(
            exit::ERROR,
            format!(
                "who holds `{}` cannot be told, so nothing is broken (a break deletes only \
                 what it showed): {error}",
                crate::printable(&args.resource)
            ),
        )
    })?;
    show(&args.resource, &shown);
    if shown.holders.is_empty() && !args.any_holder {
        println!(
            "not broken: no holder was shown, so there is nothing to break (--any-holder breaks \
             whatever the nodes hold when the break runs)"
        );
        return Ok(exit::FAILED);
    }
    if !args.yes && !confirmed(&args.resource)? {
        println!("not broken");
        return Ok(exit::FAILED);
    }
    let broken = if args.any_holder {
        manager
            .force_unlock(quorumlock::Break::WhoeverHolds(&args.resource))
            .await?
    } else {
        manager.force_unlock(&shown).await?
    };
    if broken.deleted == 0 && !args.any_holder {
        println!(
            "not broken: no node holds what was shown any more (released, or expired; another \
             holder may have it now): run it again to see"
        );
        return Ok(exit::FAILED);
    }
    println!(
        "broken: what was shown was deleted on {} of {} nodes ({} answered)",
        broken.deleted, broken.nodes, broken.answered
    );
    match broken.counter {
        _ if !broken.counter_known => println!(
            "the broken holder's token is unknown: the node that keeps the resource's counter did \
             not answer; the next holder's token is still higher than every one issued"
        ),
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
        let keys_left = if holding.seen.is_empty() {
            ""
        } else {
            " (some nodes hold a key: a client mid-acquire, or a failed attempt's, which \
             expires; a break leaves them, --any-holder does not)"
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
