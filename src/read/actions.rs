//! `bigfleet actions`: recent actions across the fleet, once or as a watch.

use bigfleet_proto::mesh::v1 as mesh;
use serde::{Deserialize, Serialize};
use svc_inspect::view::ActionView;

use super::{inspect_or_fleet, short_duration, timestamp_cell, unreachable_warnings};
use crate::Context;
use crate::error::CliError;
use crate::output::{Column, Listing, Render, dash_unless, or_dash};

/// `bigfleet actions`: a plain list, newest first (oldest first under `--watch`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Actions(pub Vec<ActionView>);

/// Recent actions (newest first) and a warning per shard that did not answer.
pub async fn actions(
    ctx: &Context,
    req: &mesh::RecentActionsRequest,
) -> Result<(Actions, Vec<String>), CliError> {
    let resp = inspect_or_fleet(
        ctx,
        "RecentActions",
        async |mut c| c.recent_actions(req.clone()).await,
        async |f| f.recent_actions(req).await,
    )
    .await?;
    Ok((
        Actions(resp.actions.iter().map(ActionView::from_proto).collect()),
        unreachable_warnings("actions", &resp.unreachable),
    ))
}

impl Render for Actions {
    fn listing(&self) -> Listing {
        let mut t = Listing::new(
            "action",
            vec![
                Column::text("FINISHED"),
                Column::text("SHARD"),
                Column::text("CLUSTER"),
                Column::text("KIND"),
                Column::text("MACHINE"),
                Column::text("OUTCOME"),
                Column::text("REASON"),
                Column::number("PRIO").wide(),
                Column::number("CYCLE").wide(),
                Column::text("NEED").wide(),
                Column::text("GROUP").wide(),
                Column::text("WAITED").wide(),
                Column::text("RAN").wide(),
                Column::text("ACTION ID").wide(),
            ],
        )
        .when_empty("no recorded action matches");
        for a in &self.0 {
            // Queueing: from the cycle's decision until a worker took the action.
            let waited = dash_unless(
                a.started_at_unix_nanos > 0 && a.decided_at_unix_nanos > 0,
                || short_duration(a.started_at_unix_nanos - a.decided_at_unix_nanos),
            );
            t.row(
                // seq is unique within one decide process of a shard.
                format!("{}/{}", a.shard_id, a.seq),
                vec![
                    timestamp_cell(a.finished_at_unix_nanos),
                    a.shard_id.clone(),
                    or_dash(a.cluster_id.clone()),
                    a.kind.clone(),
                    or_dash(a.machine_id.clone()),
                    or_dash(a.outcome.clone()),
                    or_dash(a.reason.clone()),
                    a.priority.to_string(),
                    a.cycle.to_string(),
                    or_dash(a.need_fingerprint.clone()),
                    or_dash(a.group.clone()),
                    waited,
                    dash_unless(a.started_at_unix_nanos > 0, || short_duration(a.run_nanos)),
                    or_dash(a.action_id.clone()),
                ],
            );
        }
        t
    }
}

/// The actions a watch has printed: the newest finish time and which records finished
/// exactly then (the next poll asks from that time on, so those come again).
#[derive(Debug, Default)]
pub struct SeenActions {
    newest: i64,
    at_newest: std::collections::HashSet<(String, u64)>,
}

impl SeenActions {
    /// The newest finish time admitted so far (0: none).
    pub fn newest(&self) -> i64 {
        self.newest
    }

    /// Keeps the records not printed yet, oldest first, and remembers them.
    pub fn admit(&mut self, mut batch: Vec<ActionView>) -> Vec<ActionView> {
        batch.retain(|a| {
            a.finished_at_unix_nanos > self.newest
                || (a.finished_at_unix_nanos == self.newest
                    && !self.at_newest.contains(&(a.shard_id.clone(), a.seq)))
        });
        batch.sort_by(|a, b| {
            (a.finished_at_unix_nanos, &a.shard_id, a.seq).cmp(&(
                b.finished_at_unix_nanos,
                &b.shard_id,
                b.seq,
            ))
        });
        for a in &batch {
            if a.finished_at_unix_nanos > self.newest {
                self.newest = a.finished_at_unix_nanos;
                self.at_newest.clear();
            }
            self.at_newest.insert((a.shard_id.clone(), a.seq));
        }
        batch
    }
}

/// Prints one batch of a watch on actions: the first as a listing (header included), later
/// ones as rows only; JSON and YAML print each action as its own document.
pub fn print_actions(
    out: &mut dyn std::io::Write,
    opts: crate::output::OutputOptions,
    batch: Vec<ActionView>,
    first: bool,
) -> Result<(), CliError> {
    let text = match opts.format {
        crate::output::OutputFormat::Json => batch
            .iter()
            .map(crate::output::json_string)
            .collect::<Result<String, _>>()?,
        crate::output::OutputFormat::Yaml => batch
            .iter()
            .map(|a| crate::output::yaml_string(a).map(|y| format!("---\n{y}")))
            .collect::<Result<String, _>>()?,
        crate::output::OutputFormat::Table
        | crate::output::OutputFormat::Wide
        | crate::output::OutputFormat::Name => {
            if !first && batch.is_empty() {
                return Ok(());
            }
            let rows_only = crate::output::OutputOptions {
                no_headers: opts.no_headers || !first,
                ..opts
            };
            crate::output::render(&Actions(batch), rows_only)?
        }
    };
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn act(shard: &str, seq: u64, finished: i64) -> ActionView {
        ActionView {
            shard_id: shard.into(),
            seq,
            cycle: 1,
            kind: "provision".into(),
            reason: "phase1.idle".into(),
            machine_id: format!("m-{seq}"),
            cluster_id: "c".into(),
            need_fingerprint: String::new(),
            group: String::new(),
            priority: 0,
            grace_seconds: 0.0,
            action_id: String::new(),
            outcome: "succeeded".into(),
            decided_at_unix_nanos: 0,
            started_at_unix_nanos: 0,
            finished_at_unix_nanos: finished,
            run_nanos: 0,
        }
    }

    #[test]
    fn a_watch_admits_each_action_once_oldest_first() {
        let mut seen = SeenActions::default();
        let keys = |v: Vec<ActionView>| {
            v.iter()
                .map(|a| format!("{}/{}", a.shard_id, a.seq))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            keys(seen.admit(vec![act("s1", 2, 20), act("s1", 1, 10)])),
            ["s1/1", "s1/2"]
        );
        // The newest comes again (the poll asks from its time on): not admitted twice, but
        // another action finished at the same instant is.
        assert_eq!(
            keys(seen.admit(vec![act("s2", 5, 20), act("s1", 2, 20), act("s2", 4, 15)])),
            ["s2/5"]
        );
        assert_eq!(
            keys(seen.admit(vec![act("s1", 2, 20), act("s2", 5, 20)])),
            Vec::<String>::new()
        );
        assert_eq!(keys(seen.admit(vec![act("s1", 3, 30)])), ["s1/3"]);
    }

    #[test]
    fn watched_tables_print_the_header_once() {
        let print = |batch, first| {
            let mut out = Vec::new();
            print_actions(
                &mut out,
                crate::output::OutputOptions::new(crate::output::OutputFormat::Table),
                batch,
                first,
            )
            .unwrap();
            String::from_utf8(out).unwrap()
        };
        let first = print(vec![act("s1", 1, 10)], true);
        assert!(first.starts_with("FINISHED "), "{first}");
        assert_eq!(first.lines().count(), 2, "{first}");
        let later = print(vec![act("s1", 2, 20)], false);
        assert!(
            later.starts_with("1970-01-01T00:00:00Z  s1  c  provision  m-2"),
            "{later}"
        );
        assert_eq!(later.lines().count(), 1);
        assert_eq!(print(vec![], false), "", "a quiet poll prints nothing");
        let mut json = Vec::new();
        let opts = crate::output::OutputOptions::new(crate::output::OutputFormat::Json);
        print_actions(
            &mut json,
            opts,
            vec![act("s1", 1, 10), act("s1", 2, 20)],
            true,
        )
        .unwrap();
        let docs: Vec<ActionView> = serde_json::Deserializer::from_slice(&json)
            .into_iter()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(docs.len(), 2, "one document per action");
    }
}
