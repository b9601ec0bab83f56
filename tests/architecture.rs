//! The dependency rules of the workspace (issue 19 item 7), checked over `cargo metadata` so
//! CI keeps them, not memory; and two rules over the source text: "core" and "mesh" keep one
//! meaning each (ADR-0138), and sources cite ADRs, not documents outside the repository.
//!
//! The rules are data ([`RULES`]); [`violations`] is a pure function over a parsed metadata
//! document that evaluates them over each workspace crate's *production* closure: normal
//! dependencies only (no dev- or build-dependencies), with optional dependencies counted only
//! when a feature reached through normal edges turns them on. `cargo metadata`'s resolve
//! graph unifies features across the whole workspace, dev-dependencies included (a test that
//! enables `bigfleet-shardlease/testing` makes `shardlease → testkit` look like a normal
//! edge), so the edges are re-derived per root from the declared dependencies and feature
//! tables, as cargo's feature resolver does for a release build of that crate.
//!
//! External crates are not walked: a registry crate cannot depend on a workspace path crate,
//! so every forbidden edge between workspace crates runs through workspace crates only.

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::path::Path;

/// A set of workspace crates.
#[derive(Debug, Clone, Copy)]
enum Crates {
    /// Exactly this crate.
    Named(&'static str),
    /// Every crate whose name starts with this (`svc-` = every service).
    Prefixed(&'static str),
    /// Every workspace crate except these (the test-only crates).
    AllBut(&'static [&'static str]),
}

impl Crates {
    fn matches(self, name: &str) -> bool {
        match self {
            Crates::Named(n) => name == n,
            Crates::Prefixed(p) => name.starts_with(p),
            Crates::AllBut(except) => !except.contains(&name),
        }
    }
}

/// No crate in `from` may have a crate in `to` in its production closure.
#[derive(Debug, Clone, Copy)]
struct Rule {
    name: &'static str,
    from: &'static [Crates],
    to: &'static [Crates],
}

const ENGINE: &str = "bigfleet-decision";
const MODEL: &str = "bigfleet-model";
const PROTO: &str = "bigfleet-proto";
const MESH: &str = "bigfleet-mesh";
const TESTKIT: &str = "bigfleet-testkit";
const COORDCLIENT: &str = "bigfleet-coordclient";
const DECIDE_CORE: &str = "svc-shard-decide-core";

/// The dependency rules (issue 19 item 7). One place: add a rule here, not in a test body.
const RULES: &[Rule] = &[
    Rule {
        // The engine is a pure function of the model: no wire types, no transport, no
        // service (it must stay testable and reusable without any of them).
        name: "engine-is-pure",
        from: &[Crates::Named(ENGINE)],
        to: &[
            Crates::Named(PROTO),
            Crates::Named(MESH),
            Crates::Prefixed("svc-"),
        ],
    },
    Rule {
        // The model is the domain, not the wire format; conversions live in bigfleet-conv.
        name: "model-is-not-the-wire",
        from: &[Crates::Named(MODEL)],
        to: &[Crates::Named(PROTO)],
    },
    Rule {
        // The session path and the actuation path never need the coordinator (static
        // stability) nor the engine (only decide decides).
        name: "edges-stay-off-coordinator-and-engine",
        from: &[
            Crates::Named("svc-session-gateway"),
            Crates::Named("svc-shard-execute"),
        ],
        // `Prefixed` also covers a future split-out coordinator core.
        to: &[Crates::Prefixed("svc-coordinator"), Crates::Named(ENGINE)],
    },
    Rule {
        // Test scaffolding never ships.
        name: "no-testkit-in-production",
        from: &[Crates::AllBut(&[TESTKIT])],
        to: &[Crates::Named(TESTKIT)],
    },
    Rule {
        // Hard rule 1 (static stability): the cycle never talks to the coordinator.
        name: "decide-core-without-coordinator-client",
        from: &[Crates::Named(DECIDE_CORE)],
        to: &[Crates::Named(COORDCLIENT)],
    },
];

/// Violations tolerated for now: `(rule, crate)`. Each entry must name the work that removes
/// it; an entry that no longer matches a violation fails the test, so the list only shrinks.
const KNOWN_EXCEPTIONS: &[(&str, &str)] = &[];

/// One forbidden edge: `from` reaches `to` through `path` (from … to).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Violation {
    rule: &'static str,
    from: String,
    to: String,
    path: Vec<String>,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "[{}] {} must not depend on {}: {}",
            self.rule,
            self.from,
            self.to,
            self.path.join(" -> ")
        )
    }
}

/// A workspace crate as far as the rules care: its declared normal dependencies on other
/// workspace crates and its feature table.
struct Krate<'a> {
    name: &'a str,
    /// Declared normal (non-dev, non-build) dependencies on workspace crates that the resolve
    /// graph keeps for this platform.
    deps: Vec<Dep<'a>>,
    features: BTreeMap<&'a str, Vec<&'a str>>,
}

struct Dep<'a> {
    /// The dependency's package name.
    package: &'a str,
    /// The name features refer to it by (its `rename`, else the package name).
    key: &'a str,
    optional: bool,
    default_features: bool,
    features: Vec<&'a str>,
}

fn strs(v: &Value) -> Vec<&str> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

/// The workspace crates of a metadata document, by name.
fn workspace(meta: &Value) -> BTreeMap<&str, Krate<'_>> {
    let members: BTreeSet<&str> = strs(&meta["workspace_members"]).into_iter().collect();
    let packages: HashMap<&str, &Value> = meta["packages"]
        .as_array()
        .expect("metadata has packages")
        .iter()
        .map(|p| (p["id"].as_str().expect("package id"), p))
        .collect();
    let name_of = |id: &str| packages[id]["name"].as_str().expect("package name");
    // Normal edges the resolver kept for this platform, by package name of both ends.
    let mut resolved: BTreeSet<(&str, &str)> = BTreeSet::new();
    for node in meta["resolve"]["nodes"].as_array().expect("resolve.nodes") {
        let id = node["id"].as_str().expect("node id");
        if !members.contains(id) {
            continue;
        }
        for dep in node["deps"].as_array().into_iter().flatten() {
            let pkg = dep["pkg"].as_str().expect("dep pkg");
            let normal = dep["dep_kinds"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|k| k["kind"].is_null());
            if normal && members.contains(pkg) {
                resolved.insert((name_of(id), name_of(pkg)));
            }
        }
    }
    let member_names: BTreeSet<&str> = members.iter().map(|id| name_of(id)).collect();
    members
        .iter()
        .map(|id| {
            let p = packages[id];
            let name = name_of(id);
            let deps = p["dependencies"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|d| d["kind"].is_null())
                .filter_map(|d| {
                    let package = d["name"].as_str()?;
                    if !member_names.contains(package) || !resolved.contains(&(name, package)) {
                        return None;
                    }
                    Some(Dep {
                        package,
                        key: d["rename"].as_str().unwrap_or(package),
                        optional: d["optional"].as_bool().unwrap_or(false),
                        default_features: d["uses_default_features"].as_bool().unwrap_or(true),
                        features: strs(&d["features"]),
                    })
                })
                .collect();
            let features = p["features"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(f, enables)| (f.as_str(), strs(enables)))
                .collect();
            (
                name,
                Krate {
                    name,
                    deps,
                    features,
                },
            )
        })
        .collect()
}

/// The production closure of `root` (built with its default features): every workspace crate
/// it links, with the crate each was first reached from (to print a path).
fn closure<'a>(ws: &BTreeMap<&'a str, Krate<'a>>, root: &'a str) -> BTreeMap<&'a str, &'a str> {
    let mut features: BTreeSet<(&str, &str)> = BTreeSet::new();
    let mut active_optional: BTreeSet<(&str, &str)> = BTreeSet::new();
    let mut parent: BTreeMap<&str, &str> = BTreeMap::from([(root, root)]);
    // Work items: a crate reached, or a feature of a reached crate turned on. Iterate to a
    // fixed point: a feature turned on later may activate an optional dependency.
    let mut queue: VecDeque<(&str, Option<&str>)> = VecDeque::from([(root, Some("default"))]);
    queue.push_back((root, None));
    while let Some((krate_name, feature)) = queue.pop_front() {
        let Some(krate) = ws.get(krate_name) else {
            continue;
        };
        if let Some(f) = feature {
            if !features.insert((krate_name, f)) {
                continue;
            }
            for entry in krate.features.get(f).into_iter().flatten() {
                let (dep_key, dep_feature, weak) = if let Some(d) = entry.strip_prefix("dep:") {
                    (Some(d), None, false)
                } else if let Some((d, g)) = entry.split_once("?/") {
                    (Some(d), Some(g), true)
                } else if let Some((d, g)) = entry.split_once('/') {
                    (Some(d), Some(g), false)
                } else if krate.features.contains_key(entry) {
                    queue.push_back((krate_name, Some(entry)));
                    (None, None, false)
                } else {
                    // An implicit feature of an optional dependency (pre-`dep:` syntax).
                    (Some(*entry), None, false)
                };
                let Some(dep_key) = dep_key else { continue };
                for dep in krate.deps.iter().filter(|d| d.key == dep_key) {
                    if dep.optional && !weak {
                        active_optional.insert((krate_name, dep.key));
                    }
                    if let Some(g) = dep_feature {
                        // Also for a weak (`?/`) edge not active (yet): this may turn on more
                        // than cargo would, never less, so no forbidden edge is missed.
                        queue.push_back((dep.package, Some(g)));
                    }
                }
                queue.push_back((krate_name, None));
            }
            continue;
        }
        // (Re-)walk a reached crate's edges with what is active now.
        if !parent.contains_key(krate_name) {
            continue;
        }
        for dep in &krate.deps {
            if dep.optional && !active_optional.contains(&(krate_name, dep.key)) {
                continue;
            }
            if !parent.contains_key(dep.package) {
                parent.insert(dep.package, krate_name);
                queue.push_back((dep.package, None));
            }
            if dep.default_features {
                queue.push_back((dep.package, Some("default")));
            }
            for f in &dep.features {
                queue.push_back((dep.package, Some(f)));
            }
        }
    }
    parent.remove(root);
    parent
}

/// Every rule broken in `meta`: one violation per (rule, crate, forbidden crate), each with a
/// path that brings the forbidden crate in.
fn violations(meta: &Value, rules: &[Rule]) -> Vec<Violation> {
    let ws = workspace(meta);
    let mut out = BTreeSet::new();
    for krate in ws.values() {
        let rules_here: Vec<&Rule> = rules
            .iter()
            .filter(|r| r.from.iter().any(|c| c.matches(krate.name)))
            .collect();
        if rules_here.is_empty() {
            continue;
        }
        let reached = closure(&ws, krate.name);
        for rule in rules_here {
            for &to in reached.keys() {
                if to == krate.name || !rule.to.iter().any(|c| c.matches(to)) {
                    continue;
                }
                let mut path = vec![to.to_owned()];
                let mut at = to;
                while at != krate.name {
                    at = reached.get(at).copied().unwrap_or(krate.name);
                    path.push(at.to_owned());
                }
                path.reverse();
                out.insert(Violation {
                    rule: rule.name,
                    from: krate.name.to_owned(),
                    to: to.to_owned(),
                    path,
                });
            }
        }
    }
    out.into_iter().collect()
}

/// Splits violations into those not excused, and exceptions that excuse nothing any more.
fn judge(
    found: Vec<Violation>,
    exceptions: &[(&'static str, &'static str)],
) -> (Vec<Violation>, Vec<(&'static str, &'static str)>) {
    let stale = exceptions
        .iter()
        .copied()
        .filter(|(rule, from)| !found.iter().any(|v| v.rule == *rule && v.from == *from))
        .collect();
    let unexcused = found
        .into_iter()
        .filter(|v| !exceptions.contains(&(v.rule, v.from.as_str())))
        .collect();
    (unexcused, stale)
}

fn fixture(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parse {}: {e}", path.display()))
}

/// The workspace's resolved graph for the host (see [`bigfleet_testkit::host_metadata`]).
fn workspace_metadata() -> Value {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    serde_json::from_slice(&bigfleet_testkit::host_metadata(&manifest)).expect("metadata json")
}

fn listing(v: &[Violation]) -> String {
    v.iter().map(|v| format!("  {v}\n")).collect()
}

#[test]
fn the_workspace_keeps_the_dependency_rules() {
    let found = violations(&workspace_metadata(), RULES);
    let (unexcused, stale) = judge(found, KNOWN_EXCEPTIONS);
    assert!(
        unexcused.is_empty(),
        "dependency rules broken (tests/architecture.rs RULES):\n{}",
        listing(&unexcused)
    );
    assert!(
        stale.is_empty(),
        "these KNOWN_EXCEPTIONS no longer excuse anything; delete them: {stale:?}"
    );
}

#[test]
fn a_clean_graph_passes() {
    // Dev- and build-dependencies on forbidden crates, and an optional dependency only a
    // dev-dependency's feature turns on, are not production edges.
    let v = violations(&fixture("metadata-clean.json"), RULES);
    assert!(v.is_empty(), "{}", listing(&v));
}

#[test]
fn forbidden_edges_are_reported_with_their_path() {
    let v = violations(&fixture("metadata-forbidden.json"), RULES);
    let got: Vec<String> = v.iter().map(ToString::to_string).collect();
    assert_eq!(
        got,
        [
            // A renamed dependency is still the crate it names.
            "[decide-core-without-coordinator-client] svc-shard-decide-core must not depend on bigfleet-coordclient: svc-shard-decide-core -> bigfleet-coordclient",
            "[edges-stay-off-coordinator-and-engine] svc-session-gateway must not depend on bigfleet-decision: svc-session-gateway -> bigfleet-decision",
            // `svc-coordinator*` covers a split-out coordinator core.
            "[edges-stay-off-coordinator-and-engine] svc-shard-execute must not depend on svc-coordinator-core: svc-shard-execute -> svc-coordinator-core",
            // Transitive, through a plain normal dependency.
            "[engine-is-pure] bigfleet-decision must not depend on bigfleet-proto: bigfleet-decision -> bigfleet-model -> bigfleet-proto",
            // `svc-*`: any service.
            "[engine-is-pure] bigfleet-decision must not depend on svc-inspect: bigfleet-decision -> svc-inspect",
            "[model-is-not-the-wire] bigfleet-model must not depend on bigfleet-proto: bigfleet-model -> bigfleet-proto",
            "[no-testkit-in-production] svc-coordinator must not depend on bigfleet-testkit: svc-coordinator -> bigfleet-testkit",
            // An optional dependency turned on by a normal edge's feature does count.
            "[no-testkit-in-production] svc-shard-execute must not depend on bigfleet-testkit: svc-shard-execute -> bigfleet-shardlease -> bigfleet-testkit",
        ],
        "{}",
        listing(&v)
    );
}

#[test]
fn exceptions_excuse_only_their_own_crate_and_must_stay_live() {
    let v = violations(&fixture("metadata-forbidden.json"), RULES);
    let (unexcused, stale) = judge(
        v,
        &[
            ("no-testkit-in-production", "svc-shard-execute"),
            ("no-testkit-in-production", "svc-session-gateway"),
        ],
    );
    let froms: Vec<(&str, &str)> = unexcused
        .iter()
        .map(|v| (v.rule, v.from.as_str()))
        .collect();
    assert_eq!(
        froms,
        [
            (
                "decide-core-without-coordinator-client",
                "svc-shard-decide-core"
            ),
            (
                "edges-stay-off-coordinator-and-engine",
                "svc-session-gateway"
            ),
            ("edges-stay-off-coordinator-and-engine", "svc-shard-execute"),
            ("engine-is-pure", "bigfleet-decision"),
            ("engine-is-pure", "bigfleet-decision"),
            ("model-is-not-the-wire", "bigfleet-model"),
            ("no-testkit-in-production", "svc-coordinator"),
        ]
    );
    assert_eq!(stale, [("no-testkit-in-production", "svc-session-gateway")]);
}

/// The glossary of ADR-0138: "core" is decide's domain crate only, and `bigfleet up`'s
/// harness is the *local* mesh. Returns the source paths that bring back a second meaning.
fn glossary_breaches<'a>(paths: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    paths
        .into_iter()
        .filter(|p| p.ends_with(".rs"))
        .filter(|p| {
            let in_decide_core = p.starts_with("svc-shard-decide/core/");
            let core_room = p.ends_with("/core.rs") || p.contains("/core/");
            let mesh_room = p.ends_with("/mesh.rs") || p.contains("/mesh/");
            // The plumbing crate and the contracts are the service mesh (one meaning).
            let mesh_allowed = p.starts_with("libs/mesh/")
                || p.starts_with("proto/")
                || *p == "libs/conv/src/mesh.rs";
            (core_room && !in_decide_core) || (mesh_room && !mesh_allowed)
        })
        .collect()
}

/// The files git tracks (and the untracked ones it does not ignore), as paths from the root.
fn tracked_files() -> Vec<String> {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = std::process::Command::new("git")
        .args(["ls-files", "--cached", "--others", "--exclude-standard"])
        .current_dir(root)
        .output()
        .expect("run git ls-files");
    assert!(out.status.success(), "git ls-files failed");
    let files: Vec<String> = String::from_utf8(out.stdout)
        .expect("utf-8 paths")
        .lines()
        .map(str::to_owned)
        .collect();
    assert!(
        files.iter().any(|p| p == "tests/architecture.rs"),
        "git ls-files listed nothing useful"
    );
    files
}

#[test]
fn core_and_mesh_keep_one_meaning_each() {
    let files = tracked_files();
    let breaches = glossary_breaches(files.iter().map(String::as_str));
    assert!(
        breaches.is_empty(),
        "second meanings of core/mesh (ADR-0138): {breaches:?}"
    );
}

/// Lines of a source file that send the reader to a document the repository does not hold
/// (issue 19 item 8): a section number (`ref §6`, `§12.15`) or one of the design
/// documents the project was started from. Code says the rule itself or cites an ADR, which
/// is in `docs/adr/`.
fn outside_citations(text: &str) -> Vec<usize> {
    const OUTSIDE: [&str; 5] = [
        "§",
        "ARCHITECTURE.md",
        "ARCHITECTURE §",
        "wire-and-ops",
        "decision-engine.md",
    ];
    text.lines()
        .enumerate()
        .filter(|(_, line)| OUTSIDE.iter().any(|o| line.contains(o)))
        .map(|(i, _)| i + 1)
        .collect()
}

#[test]
fn sources_cite_adrs_not_outside_documents() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    for path in tracked_files() {
        let source = [".rs", ".proto"].iter().any(|e| path.ends_with(e));
        // This file names the patterns it looks for.
        if !source || path == "tests/architecture.rs" {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(root.join(&path)) else {
            continue; // deleted in the working tree, not yet from the index
        };
        found.extend(
            outside_citations(&text)
                .into_iter()
                .map(|line| format!("{path}:{line}")),
        );
    }
    assert!(
        found.is_empty(),
        "sources citing documents that are not in the repository (say the rule or cite an ADR): {found:?}"
    );
}

/// Where a crate's integration tests would stop linking as one binary (docs/testing.md):
/// a file in `tests/` that its `tests/it.rs` does not name as a module (with
/// `autotests = false` it would never compile, let alone run), an `it.rs` in a crate that
/// still auto-discovers every file (each would run twice), or a second test file in a crate
/// without an `it.rs`. `read` gives a tracked file's text.
fn unlinked_test_files(paths: &[&str], read: impl Fn(&str) -> Option<String>) -> Vec<String> {
    let mut dirs: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for path in paths {
        let Some((dir, file)) = path.rsplit_once('/') else {
            continue;
        };
        let in_tests_root = dir == "tests" || dir.ends_with("/tests");
        if let (true, Some(stem)) = (in_tests_root, file.strip_suffix(".rs")) {
            dirs.entry(dir).or_default().push(stem);
        }
    }
    let mut found = Vec::new();
    for (dir, stems) in dirs {
        let krate = dir.strip_suffix("tests").unwrap_or_default();
        if !stems.contains(&"it") {
            if stems.len() > 1 {
                found.push(format!("{dir}: {} test files and no it.rs", stems.len()));
            }
            continue;
        }
        let manifest = read(&format!("{krate}Cargo.toml")).unwrap_or_default();
        if !manifest.lines().any(|l| l.trim() == "autotests = false") {
            found.push(format!(
                "{krate}Cargo.toml: has {dir}/it.rs but not autotests = false"
            ));
        }
        let root = read(&format!("{dir}/it.rs")).unwrap_or_default();
        for stem in stems.iter().filter(|s| **s != "it") {
            if !root.lines().any(|l| l.trim() == format!("mod {stem};")) {
                found.push(format!("{dir}/{stem}.rs: not a module of {dir}/it.rs"));
            }
        }
    }
    found
}

#[test]
fn every_test_file_is_a_module_of_its_crates_one_test_binary() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let files = tracked_files();
    let paths: Vec<&str> = files.iter().map(String::as_str).collect();
    let found = unlinked_test_files(&paths, |p| std::fs::read_to_string(root.join(p)).ok());
    assert!(
        found.is_empty(),
        "test files outside the one binary: {found:?}"
    );
}

#[test]
fn the_test_binary_check_catches_a_forgotten_file() {
    let files = HashMap::from([
        ("a/Cargo.toml", "[package]\nautotests = false\n"),
        ("a/tests/it.rs", "mod common;\n\nmod one;\n"),
        ("b/Cargo.toml", "[package]\n"),
        ("b/tests/it.rs", "mod one;\n"),
        ("tests/it.rs", "mod one;\nmod two;\n"),
        ("Cargo.toml", "autotests = false\n"),
    ]);
    let paths = [
        "a/Cargo.toml",
        "a/tests/it.rs",
        "a/tests/one.rs",
        "a/tests/forgotten.rs",
        "a/tests/common/mod.rs",
        "b/Cargo.toml",
        "b/tests/it.rs",
        "b/tests/one.rs",
        "c/tests/one.rs",
        "c/tests/two.rs",
        "d/tests/only.rs",
        "tests/it.rs",
        "tests/one.rs",
        "tests/two.rs",
        "tests/e2e/main.rs",
    ];
    let got = unlinked_test_files(&paths, |p| files.get(p).map(|t| t.to_string()));
    assert_eq!(
        got,
        [
            "a/tests/forgotten.rs: not a module of a/tests/it.rs",
            "b/Cargo.toml: has b/tests/it.rs but not autotests = false",
            "c/tests: 2 test files and no it.rs",
        ]
    );
}

/// The newest output of this package's build script (`build.rs`, the `--version` stamp)
/// in the target dir the test binaries were built into.
fn newest_stamp_output() -> Option<(std::path::PathBuf, String)> {
    let bin = Path::new(env!("CARGO_BIN_EXE_bigfleet"));
    let build = bin.parent()?.join("build");
    std::fs::read_dir(build)
        .ok()?
        .flatten()
        .filter(|e| {
            // `bigfleet-<hash>`, not `bigfleet-proto-<hash>` and the like.
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_prefix("bigfleet-")
                .is_some_and(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
        })
        .filter_map(|e| {
            let path = e.path().join("output");
            let text = std::fs::read_to_string(&path).ok()?;
            let modified = std::fs::metadata(&path).ok()?.modified().ok()?;
            text.contains("BIGFLEET_GIT_SHA")
                .then_some((modified, path, text))
        })
        .max_by_key(|(modified, ..)| *modified)
        .map(|(_, path, text)| (path, text))
}

/// Paths a build script told cargo to watch that do not exist. Cargo counts a missing
/// watched path as changed, so each one reruns the script, and rebuilds the package and
/// everything after it, on every cargo command.
fn missing_watched_paths(output: &str, manifest_dir: &Path) -> Vec<String> {
    output
        .lines()
        .filter_map(|l| {
            l.strip_prefix("cargo::rerun-if-changed=")
                .or_else(|| l.strip_prefix("cargo:rerun-if-changed="))
        })
        .filter(|p| !manifest_dir.join(p).exists())
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_version_stamp_does_not_rebuild_the_cli_on_every_command() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (path, output) =
        newest_stamp_output().expect("the bigfleet build script's output in the target dir");
    let missing = missing_watched_paths(&output, root);
    assert!(
        missing.is_empty(),
        "{} watches paths that do not exist, so every cargo command rebuilds the CLI: {missing:?}",
        path.display()
    );
}

#[test]
fn the_watch_check_catches_a_missing_path() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let output = "cargo::rerun-if-changed=build.rs\n\
                  cargo::rerun-if-changed=src\n\
                  cargo::rerun-if-changed=.git/no-such-file\n\
                  cargo:rerun-if-changed=no-such-dir\n\
                  cargo::rustc-env=BIGFLEET_GIT_SHA=abc\n";
    assert_eq!(
        missing_watched_paths(output, root),
        [".git/no-such-file", "no-such-dir"]
    );
}

#[test]
fn the_citation_check_catches_outside_documents() {
    let text = "/// Drain grace by priority gap (ref §6 table).\n\
                /// Provider records are a trust boundary (ARCHITECTURE §5.3).\n\
                /// See wire-and-ops for the metric names.\n\
                /// A failed List takes nothing away (ADR-0118).\n\
                /// The reference's `MatchProfile`.\n";
    assert_eq!(outside_citations(text), [1, 2, 3]);
}

#[test]
fn the_glossary_check_catches_the_old_names() {
    let got = glossary_breaches([
        "svc-session-gateway/src/core.rs",
        "svc-coordinator/src/core.rs",
        "src/up/mesh/spec.rs",
        "src/up/mesh.rs",
        "svc-shard-decide/core/src/shard.rs",
        "libs/mesh/src/stack.rs",
        "libs/conv/src/mesh.rs",
        "svc-inspect/src/mesh.rs",
        "src/up/local/spec.rs",
    ]);
    assert_eq!(
        got,
        [
            "svc-session-gateway/src/core.rs",
            "svc-coordinator/src/core.rs",
            "src/up/mesh/spec.rs",
            "src/up/mesh.rs",
            "svc-inspect/src/mesh.rs",
        ]
    );
}
