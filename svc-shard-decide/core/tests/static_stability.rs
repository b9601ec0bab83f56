//! Hard rule 1 (static stability), checked over the real dependency graph:
//! the crate that runs the cycle has neither the coordinator client nor the
//! coordinator proto module (`bigfleet-proto/coordinator`) anywhere in its
//! dependency closure — production or test.

use serde_json::{Value, json};
use std::collections::{BTreeSet, HashMap, VecDeque};

const ROOT: &str = "svc-shard-decide-core";
const FORBIDDEN_CRATE: &str = "bigfleet-coordclient";
const PROTO: &str = "bigfleet-proto";
const PROTO_FEATURE: &str = "coordinator";

/// Everything wrong with `root`'s closure in a `cargo metadata` document.
/// The root's dev-dependencies count (its tests must not link the coordinator
/// either); other packages' dev-dependencies are never built for it.
fn violations(meta: &Value, root: &str) -> Vec<String> {
    let packages: HashMap<&str, &Value> = meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|p| (p["id"].as_str().unwrap(), p))
        .collect();
    let nodes: HashMap<&str, &Value> = meta["resolve"]["nodes"]
        .as_array()
        .expect("resolve.nodes")
        .iter()
        .map(|n| (n["id"].as_str().unwrap(), n))
        .collect();
    let root_id = packages
        .iter()
        .find(|(_, p)| p["name"] == root)
        .map(|(id, _)| *id)
        .unwrap_or_else(|| panic!("{root} not in the workspace"));

    let mut seen = BTreeSet::new();
    let mut queue = VecDeque::from([root_id]);
    while let Some(id) = queue.pop_front() {
        if !seen.insert(id) {
            continue;
        }
        let is_root = id == root_id;
        for dep in nodes[id]["deps"].as_array().into_iter().flatten() {
            let built = dep["dep_kinds"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|k| is_root || k["kind"] != "dev");
            if built {
                queue.push_back(dep["pkg"].as_str().unwrap());
            }
        }
    }

    let mut out = Vec::new();
    for id in &seen {
        let p = packages[id];
        let name = p["name"].as_str().unwrap();
        if name == FORBIDDEN_CRATE {
            out.push(format!("{FORBIDDEN_CRATE} is in the closure of {root}"));
        }
        let is_root = *id == root_id;
        for d in p["dependencies"].as_array().into_iter().flatten() {
            let counts = is_root || d["kind"] != "dev";
            let enables = d["features"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|f| f == PROTO_FEATURE);
            if counts && d["name"] == PROTO && enables {
                out.push(format!(
                    "{name} depends on {PROTO} with feature {PROTO_FEATURE}"
                ));
            }
        }
        for (feature, enables) in p["features"].as_object().into_iter().flatten() {
            for e in enables.as_array().into_iter().flatten() {
                let e = e.as_str().unwrap_or_default();
                if e == format!("{PROTO}/{PROTO_FEATURE}")
                    || e == format!("{PROTO}?/{PROTO_FEATURE}")
                {
                    out.push(format!("{name}'s feature {feature} enables {e}"));
                }
            }
        }
    }
    out
}

/// The workspace's resolved graph for the host (see [`bigfleet_testkit::host_metadata`]).
fn workspace_metadata() -> Value {
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../../Cargo.toml");
    serde_json::from_slice(&bigfleet_testkit::host_metadata(manifest.as_ref()))
        .expect("metadata json")
}

#[test]
fn the_cycle_crate_never_links_the_coordinator() {
    let meta = workspace_metadata();
    let v = violations(&meta, ROOT);
    assert!(v.is_empty(), "static stability broken:\n{}", v.join("\n"));
    // The check is live on the real graph: the coordinator client does
    // enable the feature, and the checker sees it.
    let client = violations(&meta, FORBIDDEN_CRATE);
    let edge = format!("{FORBIDDEN_CRATE} depends on {PROTO} with feature {PROTO_FEATURE}");
    assert!(client.contains(&edge), "{client:?}");
}

/// A minimal metadata document: root → mid → proto, plus an optional
/// offending edge.
fn synthetic(mid_features: &[&str], mid_dep_kind: Value, extra: Option<&str>) -> Value {
    let pkg = |name: &str, deps: Value, features: Value| json!({"id": format!("{name} 0.1.0"), "name": name, "dependencies": deps, "features": features});
    let mut packages = vec![
        pkg(
            ROOT,
            json!([{"name": "mid", "kind": null, "features": []}]),
            json!({}),
        ),
        pkg(
            "mid",
            json!([{"name": PROTO, "kind": mid_dep_kind, "features": mid_features}]),
            json!({}),
        ),
        pkg(PROTO, json!([]), json!({"coordinator": []})),
    ];
    let mut root_deps = vec![json!({"pkg": "mid 0.1.0", "dep_kinds": [{"kind": null}]})];
    if let Some(x) = extra {
        packages.push(pkg(x, json!([]), json!({})));
        root_deps.push(json!({"pkg": format!("{x} 0.1.0"), "dep_kinds": [{"kind": "dev"}]}));
    }
    let mut nodes = vec![
        json!({"id": format!("{ROOT} 0.1.0"), "deps": root_deps}),
        json!({"id": "mid 0.1.0", "deps": [{"pkg": format!("{PROTO} 0.1.0"), "dep_kinds": [{"kind": mid_dep_kind}]}]}),
        json!({"id": format!("{PROTO} 0.1.0"), "deps": []}),
    ];
    if let Some(x) = extra {
        nodes.push(json!({"id": format!("{x} 0.1.0"), "deps": []}));
    }
    json!({"packages": packages, "resolve": {"nodes": nodes}})
}

#[test]
fn the_checker_catches_feature_edges_and_the_client_crate() {
    assert!(violations(&synthetic(&[], Value::Null, None), ROOT).is_empty());
    let v = violations(&synthetic(&["coordinator"], Value::Null, None), ROOT);
    assert_eq!(
        v,
        ["mid depends on bigfleet-proto with feature coordinator"]
    );
    // A dev edge of a dependency is never built for the root.
    assert!(violations(&synthetic(&["coordinator"], json!("dev"), None), ROOT).is_empty());
    // The root's own dev-dependencies do count.
    let v = violations(&synthetic(&[], Value::Null, Some(FORBIDDEN_CRATE)), ROOT);
    assert_eq!(
        v,
        [format!("{FORBIDDEN_CRATE} is in the closure of {ROOT}")]
    );
}
