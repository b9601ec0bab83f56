//! `docs/metrics.md` against the code, and the observability kit against `docs/metrics.md`.
//!
//! * Every service's metrics are registered into one registry per service, exactly as its
//!   `start` does (nothing is started), and the generated table in `docs/metrics.md` must list
//!   exactly those families: name, type, labels, help and which services export them.
//!   `BIGFLEET_BLESS=1 cargo test --test it metrics_doc` rewrites the table (and the chart's
//!   copies of the kit) instead of failing.
//! * One name, one meaning: a name registered by two services has the same type, labels and
//!   help in both, and no `bigfleet_shard_*` name comes from two containers of the shard pod
//!   (gateway, decide, execute), so summing by pod never counts a thing twice.
//! * `deploy/observability/alerts.yaml` (a PrometheusRule `groups:` file) and
//!   `grafana-dashboard.json` are well formed and reference only documented metrics; the chart
//!   ships byte-identical copies. `promtool check rules` runs too when promtool is installed
//!   (`$BIGFLEET_PROMTOOL` or on PATH; scripts/install-test-deps provides it), and
//!   `promtool test rules` runs the alerts' unit tests in `alerts.test.yaml`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use bigfleet_mesh::GrpcMetrics;
use bigfleet_telemetry::{MetricDescription, MetricsRegistry};

const BEGIN: &str = "<!-- metrics-table:begin -->";
const END: &str = "<!-- metrics-table:end -->";
const HEADER: &str = "| metric | type | labels | exported by | help |\n|---|---|---|---|---|\n";

/// Containers of the shard pod (one pod: a name must not mean two things in it).
const SHARD_POD: &[&str] = &["gateway", "decide", "execute"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn blessing() -> bool {
    std::env::var_os("BIGFLEET_BLESS").is_some_and(|v| v != "0" && !v.is_empty())
}

/// What each service registers in its `start`, in a registry of its own, plus what the ops
/// server adds to every one (`process_*`, `bigfleet_build_info`).
fn registries() -> Vec<(&'static str, MetricsRegistry)> {
    let mut out = Vec::new();
    let mut add = |service: &'static str, f: &dyn Fn(&MetricsRegistry)| {
        let reg = MetricsRegistry::new();
        f(&reg);
        reg.register_process_metrics(service).unwrap();
        out.push((service, reg));
    };
    add("gateway", &|r| {
        svc_session_gateway::GatewayMetrics::register(r).unwrap();
        GrpcMetrics::server(r).unwrap();
    });
    add("decide", &|r| {
        svc_shard_decide_core::ShardMetrics::register(r).unwrap();
        GrpcMetrics::server(r).unwrap();
        GrpcMetrics::client(r).unwrap();
    });
    add("execute", &|r| {
        svc_shard_execute::ExecuteMetrics::register(r).unwrap();
        GrpcMetrics::client(r).unwrap();
    });
    add("coordinator", &|r| {
        svc_coordinator::metrics::Metrics::register(r).unwrap();
        GrpcMetrics::server(r).unwrap();
    });
    add("inspect", &|r| {
        GrpcMetrics::server(r).unwrap();
        svc_inspect::fleet::FleetMetrics::register(r).unwrap();
    });
    add("fake-provider", &|r| {
        bigfleet_fake_provider::metrics::ProviderMetrics::register(r).unwrap();
    });
    out
}

/// One row of the table: a family and the services exporting it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Row {
    name: String,
    kind: String,
    labels: Vec<String>,
    services: Vec<String>,
    help: String,
}

impl Row {
    fn render(&self) -> String {
        let labels = if self.labels.is_empty() {
            "—".to_owned()
        } else {
            self.labels
                .iter()
                .map(|l| format!("`{l}`"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        format!(
            "| `{}` | {} | {} | {} | {} |",
            self.name,
            self.kind,
            labels,
            self.services.join(", "),
            self.help.replace('|', "\\|")
        )
    }

    fn parse(line: &str) -> Option<Row> {
        let line = line.trim();
        let inner = line.strip_prefix('|')?.strip_suffix('|')?;
        // Split on unescaped pipes.
        let mut cells = Vec::new();
        let mut cur = String::new();
        let mut chars = inner.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\\' if chars.peek() == Some(&'|') => {
                    cur.push('|');
                    chars.next();
                }
                '|' => cells.push(std::mem::take(&mut cur)),
                c => cur.push(c),
            }
        }
        cells.push(cur);
        let cells: Vec<&str> = cells.iter().map(|c| c.trim()).collect();
        let [name, kind, labels, services, help] = cells[..] else {
            return None;
        };
        let name = name.strip_prefix('`')?.strip_suffix('`')?.to_owned();
        let labels = if labels == "—" {
            Vec::new()
        } else {
            labels
                .split(',')
                .map(|l| l.trim().trim_matches('`').to_owned())
                .collect()
        };
        Some(Row {
            name,
            kind: kind.to_owned(),
            labels,
            services: services.split(',').map(|s| s.trim().to_owned()).collect(),
            help: help.to_owned(),
        })
    }
}

/// The rows the code produces, or the meaning clashes that prevent one row per name.
fn code_rows() -> Result<Vec<Row>, Vec<String>> {
    let mut by_name: BTreeMap<String, (MetricDescription, Vec<String>)> = BTreeMap::new();
    let mut clashes = Vec::new();
    for (service, reg) in registries() {
        for d in reg.described() {
            match by_name.get_mut(&d.name) {
                None => {
                    by_name.insert(d.name.clone(), (d, vec![service.to_owned()]));
                }
                Some((first, services)) => {
                    if (first.kind, &first.labels, &first.help) != (d.kind, &d.labels, &d.help) {
                        clashes.push(format!(
                            "{} means two things: {first:?} in {services:?}, {d:?} in {service}",
                            d.name
                        ));
                    }
                    services.push(service.to_owned());
                }
            }
        }
    }
    for (name, (_, services)) in &by_name {
        let in_pod: Vec<_> = services
            .iter()
            .filter(|s| SHARD_POD.contains(&s.as_str()))
            .collect();
        if name.starts_with("bigfleet_shard_") && in_pod.len() > 1 {
            clashes.push(format!(
                "{name} is exported by {in_pod:?}, containers of one shard pod: summing by pod counts it twice"
            ));
        }
    }
    if !clashes.is_empty() {
        return Err(clashes);
    }
    Ok(by_name
        .into_values()
        .map(|(d, services)| Row {
            name: d.name,
            kind: d.kind.to_owned(),
            labels: d.labels,
            services,
            help: d.help,
        })
        .collect())
}

fn doc_table(doc: &str) -> (usize, usize, Vec<Row>) {
    let start = doc
        .find(BEGIN)
        .expect("docs/metrics.md lacks the table begin marker")
        + BEGIN.len();
    let end = doc
        .find(END)
        .expect("docs/metrics.md lacks the table end marker");
    assert!(start <= end, "markers out of order");
    let rows = doc[start..end]
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| Row::parse(l).unwrap_or_else(|| panic!("unparseable row: {l}")))
        .collect();
    (start, end, rows)
}

fn render_table(rows: &[Row]) -> String {
    let mut s = String::from("\n");
    s.push_str(HEADER);
    for r in rows {
        s.push_str(&r.render());
        s.push('\n');
    }
    s
}

/// Differences between the documented rows and the code's, one line each.
fn diff(doc: &[Row], code: &[Row]) -> Vec<String> {
    let d: BTreeMap<_, _> = doc.iter().map(|r| (r.name.as_str(), r)).collect();
    let c: BTreeMap<_, _> = code.iter().map(|r| (r.name.as_str(), r)).collect();
    let mut out = Vec::new();
    for (name, row) in &c {
        match d.get(name) {
            None => out.push(format!("missing from docs/metrics.md: {}", row.render())),
            Some(doc_row) if doc_row != row => out.push(format!(
                "changed:\n    doc:  {}\n    code: {}",
                doc_row.render(),
                row.render()
            )),
            Some(_) => {}
        }
    }
    for name in d.keys().filter(|n| !c.contains_key(*n)) {
        out.push(format!(
            "documented but not registered by any service: {name}"
        ));
    }
    if doc.len() != d.len() {
        out.push("a metric is listed twice".to_owned());
    }
    out
}

#[test]
fn docs_metrics_md_lists_exactly_what_the_services_register() {
    let rows = code_rows()
        .unwrap_or_else(|clashes| panic!("one name, one meaning:\n  {}", clashes.join("\n  ")));
    assert!(
        rows.len() > 80,
        "suspiciously few metrics registered: {}",
        rows.len()
    );
    let doc = read("docs/metrics.md");
    let (start, end, documented) = doc_table(&doc);
    let problems = diff(&documented, &rows);
    if problems.is_empty() {
        return;
    }
    if blessing() {
        let fresh = format!("{}{}{}", &doc[..start], render_table(&rows), &doc[end..]);
        std::fs::write(root().join("docs/metrics.md"), fresh).unwrap();
        eprintln!("docs/metrics.md rewritten ({} rows)", rows.len());
        return;
    }
    panic!(
        "docs/metrics.md is out of date with the code (BIGFLEET_BLESS=1 cargo test --test it metrics_doc rewrites it):\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn the_table_parser_and_the_diff_catch_drift() {
    let row = |name: &str, help: &str| Row {
        name: name.to_owned(),
        kind: "counter".to_owned(),
        labels: vec!["kind".to_owned(), "outcome".to_owned()],
        services: vec!["decide".to_owned(), "execute".to_owned()],
        help: help.to_owned(),
    };
    let a = row("a_total", "a | b");
    assert_eq!(Row::parse(&a.render()), Some(a.clone()));
    let b = row("b_total", "b");
    assert!(diff(&[a.clone(), b.clone()], &[a.clone(), b.clone()]).is_empty());
    let d = diff(std::slice::from_ref(&a), &[a.clone(), b.clone()]);
    assert!(
        d[0].starts_with("missing") && d[0].contains("b_total"),
        "{d:?}"
    );
    let d = diff(&[a.clone(), b.clone()], std::slice::from_ref(&a));
    assert!(
        d[0].starts_with("documented but not") && d[0].contains("b_total"),
        "{d:?}"
    );
    let d = diff(
        &[a.clone(), row("b_total", "other")],
        &[a.clone(), b.clone()],
    );
    assert!(d[0].starts_with("changed"), "{d:?}");
}

#[test]
fn one_name_means_one_thing_across_the_shard_pod() {
    // The live registries pass (also checked above); a clash built here must be caught.
    let rows = code_rows().unwrap_or_else(|c| panic!("{c:#?}"));
    let shard_names: Vec<_> = rows
        .iter()
        .filter(|r| r.name.starts_with("bigfleet_shard_"))
        .collect();
    assert!(shard_names.len() > 40);
    for r in shard_names {
        let n = r
            .services
            .iter()
            .filter(|s| SHARD_POD.contains(&s.as_str()))
            .count();
        assert_eq!(n, 1, "{} from {:?}", r.name, r.services);
    }
    // The names the original's catalog has stay: exported by the pod.
    for name in [
        "bigfleet_shard_active_sessions",
        "bigfleet_shard_session_lifecycle_total",
        "bigfleet_shard_rollups_rejected_total",
        "bigfleet_shard_request_bootstrap_seconds",
        "bigfleet_shard_execute_inflight",
        "bigfleet_shard_action_execute_outcomes_total",
        "bigfleet_shard_configure_phase_seconds",
        "bigfleet_shard_drain_phase_seconds",
        "bigfleet_shard_session_identity_rejected_total",
    ] {
        assert!(rows.iter().any(|r| r.name == name), "{name} gone");
    }
}

/// Metric names in a PromQL expression: identifiers with a known prefix, a histogram's
/// `_bucket`/`_sum`/`_count` series mapped to the family.
/// One query of `whose` (an alert, a panel) must use a documented metric and only
/// documented ones; the ones it uses join `used`.
fn check_expr(
    whose: &str,
    expr: &str,
    known: &BTreeMap<String, String>,
    used: &mut BTreeSet<String>,
    problems: &mut Vec<String>,
) {
    let (found, unknown) = metrics_in(expr, known);
    if found.is_empty() {
        problems.push(format!("{whose}: {expr:?} uses no documented metric"));
    }
    for u in unknown {
        problems.push(format!("{whose}: {u} is not in docs/metrics.md"));
    }
    used.extend(found);
}

/// A problem (`<missing> <metric>`) for every metric of `wanted` that `used` lacks.
fn require_used(
    used: &BTreeSet<String>,
    missing: &str,
    wanted: &[&str],
    problems: &mut Vec<String>,
) {
    for metric in wanted {
        if !used.contains(*metric) {
            problems.push(format!("{missing} {metric}"));
        }
    }
}

fn metrics_in(expr: &str, known: &BTreeMap<String, String>) -> (BTreeSet<String>, Vec<String>) {
    let mut found = BTreeSet::new();
    let mut unknown = Vec::new();
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut rest = expr;
    // Label matchers and strings are skipped: only text outside {...} and "..." is scanned.
    let mut scan = String::new();
    let (mut depth, mut quoted) = (0, false);
    for c in rest.chars() {
        match c {
            '"' => quoted = !quoted,
            '{' if !quoted => depth += 1,
            '}' if !quoted => depth -= 1,
            c if !quoted && depth == 0 => scan.push(c),
            _ => {}
        }
        if depth == 0 && !quoted && c == '}' {
            scan.push(' ');
        }
    }
    rest = &scan;
    for word in rest.split(|c: char| !is_ident(c)) {
        if !["bigfleet_", "grpc_", "process_"]
            .iter()
            .any(|p| word.starts_with(p))
        {
            continue;
        }
        let family = if known.contains_key(word) {
            Some(word.to_owned())
        } else {
            ["_bucket", "_sum", "_count"].iter().find_map(|s| {
                let base = word.strip_suffix(s)?;
                (known.get(base).map(String::as_str) == Some("histogram")).then(|| base.to_owned())
            })
        };
        match family {
            Some(f) => {
                found.insert(f);
            }
            None => unknown.push(word.to_owned()),
        }
    }
    (found, unknown)
}

/// Documented names and their types.
fn documented() -> BTreeMap<String, String> {
    let doc = read("docs/metrics.md");
    doc_table(&doc)
        .2
        .into_iter()
        .map(|r| (r.name, r.kind))
        .collect()
}

#[test]
fn the_metric_scanner_sees_through_promql() {
    let known: BTreeMap<String, String> = [
        ("bigfleet_shard_cycle_duration_seconds", "histogram"),
        ("bigfleet_shard_cycles_total", "counter"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    let (found, unknown) = metrics_in(
        r#"histogram_quantile(0.99, sum by (le) (rate(bigfleet_shard_cycle_duration_seconds_bucket{shard=~"$shard",x="bigfleet_nope"}[5m]))) > 0 and rate(bigfleet_shard_cycles_total[5m]) == 0 or bigfleet_shard_typo_total"#,
        &known,
    );
    assert_eq!(found.len(), 2, "{found:?}");
    assert_eq!(unknown, ["bigfleet_shard_typo_total"]);
    let (_, unknown) = metrics_in("bigfleet_shard_cycles_total_bucket", &known);
    assert_eq!(unknown.len(), 1, "a counter has no buckets");
}

/// One alerting rule of alerts.yaml: its key: value lines (nested keys as `labels.severity`).
#[derive(Debug, Default)]
struct Rule {
    alert: String,
    fields: BTreeMap<String, String>,
}

/// A structural reading of the `groups:` file: the subset of YAML it is written in (block
/// mappings and sequences, `|` / `>` block scalars, no flow collections, no anchors).
fn parse_rules(text: &str) -> Result<(Vec<String>, Vec<Rule>), String> {
    let mut groups = Vec::new();
    let mut rules: Vec<Rule> = Vec::new();
    let mut lines = text.lines().enumerate().peekable();
    let mut saw_groups = false;
    // (indent of the rule's keys, current nested key and its indent)
    let mut rule_indent = None::<usize>;
    let mut parent: Option<(usize, String)> = None;
    while let Some((i, line)) = lines.next() {
        let n = i + 1;
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        if line.contains('\t') {
            return Err(format!("line {n}: tab"));
        }
        let indent = line.len() - line.trim_start().len();
        let t = line.trim_start();
        if indent == 0 {
            if t != "groups:" {
                return Err(format!(
                    "line {n}: only `groups:` at the top level, got {t:?}"
                ));
            }
            saw_groups = true;
            continue;
        }
        if !saw_groups {
            return Err(format!("line {n}: before `groups:`"));
        }
        if let Some(name) = t.strip_prefix("- name:") {
            groups.push(name.trim().to_owned());
            rule_indent = None;
            continue;
        }
        if let Some(name) = t.strip_prefix("- alert:") {
            rules.push(Rule {
                alert: name.trim().to_owned(),
                ..Rule::default()
            });
            rule_indent = Some(indent + 2);
            parent = None;
            continue;
        }
        if t == "rules:" || t.starts_with("interval:") {
            continue;
        }
        if t.starts_with("- record:") {
            return Err(format!("line {n}: recording rules are not expected here"));
        }
        let (Some(ri), Some(rule)) = (rule_indent, rules.last_mut()) else {
            return Err(format!("line {n}: {t:?} outside a rule"));
        };
        let Some((key, value)) = t.split_once(':') else {
            return Err(format!("line {n}: not a `key: value` line: {t:?}"));
        };
        if indent < ri {
            return Err(format!("line {n}: dedented out of the rule"));
        }
        let key = if indent == ri {
            parent = Some((indent, key.to_owned()));
            key.to_owned()
        } else {
            match &parent {
                Some((pi, p)) if indent > *pi => format!("{p}.{key}"),
                _ => return Err(format!("line {n}: nested key without a parent")),
            }
        };
        let mut value = value.trim().to_owned();
        if value == "|" || value == ">" || value == "|-" || value == ">-" {
            let mut block = Vec::new();
            while let Some((_, next)) = lines.peek() {
                let ni = next.len() - next.trim_start().len();
                if !next.trim().is_empty() && ni <= indent {
                    break;
                }
                block.push(next.trim().to_owned());
                lines.next();
            }
            value = block.join(" ").trim().to_owned();
        }
        if value.starts_with('[') || value.starts_with('&') || value.starts_with('*') {
            return Err(format!(
                "line {n}: flow collections and anchors are not used here"
            ));
        }
        rule.fields.insert(key, value.trim_matches('"').to_owned());
    }
    if !saw_groups || groups.is_empty() {
        return Err("no groups".to_owned());
    }
    Ok((groups, rules))
}

#[test]
fn the_rules_parser_rejects_what_it_should() {
    let good = "groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: |\n          up\n          == 0\n        for: 5m\n        labels:\n          severity: page\n";
    let (groups, rules) = parse_rules(good).unwrap();
    assert_eq!(groups, ["g"]);
    assert_eq!(rules[0].fields["expr"], "up == 0");
    assert_eq!(rules[0].fields["labels.severity"], "page");
    assert!(parse_rules("group:\n  - name: g\n").is_err());
    assert!(
        parse_rules("groups:\n  - name: g\n    rules:\n      - alert: A\n        expr up\n")
            .is_err()
    );
    assert!(parse_rules("groups:\n\t- name: g\n").is_err());
}

fn is_duration(s: &str) -> bool {
    let digits = s.trim_end_matches(|c: char| "smhdw".contains(c));
    !digits.is_empty() && digits.len() < s.len() && digits.chars().all(|c| c.is_ascii_digit())
}

#[test]
fn the_alert_rules_are_well_formed_and_use_documented_metrics() {
    let known = documented();
    let text = read("deploy/observability/alerts.yaml");
    let (groups, rules) = parse_rules(&text).unwrap_or_else(|e| panic!("alerts.yaml: {e}"));
    assert!(!groups.is_empty());
    let mut problems = Vec::new();
    let mut names = BTreeSet::new();
    let mut used = BTreeSet::new();
    for r in &rules {
        if !names.insert(r.alert.clone()) {
            problems.push(format!("{}: duplicate alert name", r.alert));
        }
        if !r.alert.starts_with("BigFleet") {
            problems.push(format!("{}: alert names start with BigFleet", r.alert));
        }
        for key in [
            "expr",
            "for",
            "labels.severity",
            "annotations.summary",
            "annotations.description",
        ] {
            if r.fields.get(key).is_none_or(|v| v.is_empty()) {
                problems.push(format!("{}: no {key}", r.alert));
            }
        }
        if let Some(f) = r.fields.get("for")
            && !is_duration(f)
        {
            problems.push(format!("{}: `for: {f}` is not a duration", r.alert));
        }
        if let Some(s) = r.fields.get("labels.severity")
            && !["critical", "warning", "info"].contains(&s.as_str())
        {
            problems.push(format!("{}: severity {s}", r.alert));
        }
        let expr = r.fields.get("expr").cloned().unwrap_or_default();
        check_expr(&r.alert, &expr, &known, &mut used, &mut problems);
    }
    // The alerts issue 20 asks for, by the metric each one watches.
    require_used(
        &used,
        "no alert watches",
        &[
            "bigfleet_shard_cycles_total",
            "bigfleet_shard_reconcile_errors_total",
            "bigfleet_shard_inventory_age_seconds",
            "bigfleet_shard_removals_held",
            "bigfleet_shard_shortfalls_aged",
            "bigfleet_shard_rollup_quarantined",
            "bigfleet_shard_reclaims_capped_total",
            "bigfleet_coordinator_is_leader",
            "bigfleet_shard_session_lifecycle_total",
        ],
        &mut problems,
    );
    // docs/metrics.md's alert table: the same alerts with the same `for`.
    let doc = read("docs/metrics.md");
    let documented: BTreeMap<String, String> = doc
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l
                .trim()
                .trim_matches('|')
                .split('|')
                .map(str::trim)
                .collect();
            let name = cells
                .first()?
                .strip_prefix("`BigFleet")?
                .strip_suffix('`')?;
            Some((format!("BigFleet{name}"), cells.last()?.to_string()))
        })
        .collect();
    let actual: BTreeMap<String, String> = rules
        .iter()
        .map(|r| {
            (
                r.alert.clone(),
                r.fields.get("for").cloned().unwrap_or_default(),
            )
        })
        .collect();
    if documented != actual {
        problems.push(format!(
            "docs/metrics.md's alert table {documented:?} is not alerts.yaml's {actual:?}"
        ));
    }
    assert!(
        problems.is_empty(),
        "alerts.yaml:\n  {}",
        problems.join("\n  ")
    );
    let dir = root().join("deploy/observability");
    promtool(&["check", "rules"], &dir.join("alerts.yaml"));
    promtool(&["test", "rules"], &dir.join("alerts.test.yaml"));
}

/// `promtool <args> <file>`, which must succeed; skipped (with a line saying so) where
/// promtool is not installed.
fn promtool(args: &[&str], file: &Path) {
    let promtool = std::env::var_os("BIGFLEET_PROMTOOL")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("PATH").and_then(|p| {
                std::env::split_paths(&p)
                    .map(|d| d.join("promtool"))
                    .find(|f| f.is_file())
            })
        });
    let Some(promtool) = promtool else {
        eprintln!("promtool not installed: the rules were checked structurally only");
        return;
    };
    let out = std::process::Command::new(&promtool)
        .args(args)
        .arg(file)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", promtool.display()));
    assert!(
        out.status.success(),
        "promtool {} {} failed:\n{}{}",
        args.join(" "),
        file.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_dashboard_is_well_formed_and_uses_documented_metrics() {
    let known = documented();
    let text = read("deploy/observability/grafana-dashboard.json");
    let dash: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("grafana-dashboard.json: {e}"));
    let mut problems = Vec::new();
    for key in ["title", "uid"] {
        if dash[key].as_str().is_none_or(|s| s.is_empty()) {
            problems.push(format!("no {key}"));
        }
    }
    if !dash["schemaVersion"].is_u64() {
        problems.push("no schemaVersion".to_owned());
    }
    let vars: BTreeMap<&str, &serde_json::Value> = dash["templating"]["list"]
        .as_array()
        .map(|l| {
            l.iter()
                .filter_map(|v| Some((v["name"].as_str()?, v)))
                .collect()
        })
        .unwrap_or_default();
    for var in ["datasource", "shard", "cluster"] {
        if !vars.contains_key(var) {
            problems.push(format!("no template variable {var}"));
        }
    }
    for var in ["shard", "cluster"] {
        if let Some(v) = vars.get(var) {
            let query = v["query"]["query"]
                .as_str()
                .or(v["query"].as_str())
                .unwrap_or("");
            let (found, unknown) = metrics_in(query, &known);
            if found.is_empty() || !unknown.is_empty() {
                problems.push(format!(
                    "variable {var}: query {query:?} uses {found:?}, unknown {unknown:?}"
                ));
            }
        }
    }
    let panels = dash["panels"].as_array().cloned().unwrap_or_default();
    let mut ids = BTreeSet::new();
    let mut rows = Vec::new();
    let mut used = BTreeSet::new();
    for p in &panels {
        let title = p["title"].as_str().unwrap_or("").to_owned();
        let kind = p["type"].as_str().unwrap_or("");
        if !p["id"].as_u64().is_some_and(|id| ids.insert(id)) {
            problems.push(format!("panel {title:?}: missing or duplicate id"));
        }
        for g in ["h", "w", "x", "y"] {
            if !p["gridPos"][g].is_u64() {
                problems.push(format!("panel {title:?}: gridPos.{g}"));
            }
        }
        if p["gridPos"]["x"].as_u64().unwrap_or(0) + p["gridPos"]["w"].as_u64().unwrap_or(0) > 24 {
            problems.push(format!("panel {title:?}: wider than the 24-column grid"));
        }
        if kind == "row" {
            rows.push(title);
            continue;
        }
        if ![
            "timeseries",
            "stat",
            "table",
            "bargauge",
            "gauge",
            "state-timeline",
        ]
        .contains(&kind)
        {
            problems.push(format!("panel {title:?}: type {kind:?}"));
        }
        if title.is_empty() {
            problems.push("a panel without a title".to_owned());
        }
        let targets = p["targets"].as_array().cloned().unwrap_or_default();
        if targets.is_empty() {
            problems.push(format!("panel {title:?}: no targets"));
        }
        for t in targets {
            let expr = t["expr"].as_str().unwrap_or("");
            if t["refId"].as_str().is_none() {
                problems.push(format!("panel {title:?}: target without refId"));
            }
            let whose = format!("panel {title:?}");
            check_expr(&whose, expr, &known, &mut used, &mut problems);
        }
    }
    for row in ["Fleet", "Shard", "Cluster", "Coordinator", "Process"] {
        if !rows
            .iter()
            .any(|r| r.to_lowercase().contains(&row.to_lowercase()))
        {
            problems.push(format!("no row titled …{row}… (rows: {rows:?})"));
        }
    }
    require_used(
        &used,
        "no panel shows",
        &[
            "bigfleet_shard_cycle_duration_seconds",
            "bigfleet_shard_actions_total",
            "bigfleet_shard_shortfalls",
            "bigfleet_shard_shortfalls_aged",
            "bigfleet_shard_rollup_quarantined",
            "bigfleet_shard_reclaims_capped_total",
            "bigfleet_shard_active_sessions",
            "bigfleet_shard_rollups_rejected_total",
            "bigfleet_shard_rollups_unchanged_total",
            "bigfleet_shard_demand_to_decision_seconds",
            "bigfleet_shard_inventory_machines",
            "bigfleet_coordinator_is_leader",
            "bigfleet_coordinator_raft_term",
            "process_cpu_seconds_total",
            "process_resident_memory_bytes",
        ],
        &mut problems,
    );
    assert!(
        problems.is_empty(),
        "grafana-dashboard.json:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn the_chart_ships_the_kit_unchanged() {
    for file in ["alerts.yaml", "grafana-dashboard.json"] {
        let canonical = read(&format!("deploy/observability/{file}"));
        let copy_rel = format!("helm/bigfleet/files/observability/{file}");
        let copy = std::fs::read_to_string(root().join(&copy_rel)).unwrap_or_default();
        if copy == canonical {
            continue;
        }
        if blessing() {
            let path = root().join(&copy_rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, canonical).unwrap();
            continue;
        }
        panic!("{copy_rel} differs from deploy/observability/{file} (BIGFLEET_BLESS=1 copies it)");
    }
}
