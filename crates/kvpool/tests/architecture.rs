//! The workspace's dependency rules (docs/architecture.md), checked against
//! what the manifests actually say. A crate that gains a forbidden
//! dependency (the master linking the data plane, a core crate linking the
//! binary) fails here, not in review.
//!
//! Reads `cargo metadata --no-deps`: only the workspace's own manifests,
//! so it needs no network and no build. Normal, dev and build dependencies
//! all count: a test-only arrow still couples the crates.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// Libraries the binary and the bindings compose.
const LIBS: &[&str] = &[
    "kvpool-proto",
    "kvpool-format",
    "kvpool-net",
    "kvpool-transfer",
    "kvpool-store",
    "kvpool-client",
];

/// Each workspace crate and the workspace crates it may depend on.
fn rules() -> BTreeMap<&'static str, Vec<&'static str>> {
    let mut binary = LIBS.to_vec();
    binary.push("kvpool-master");
    // Its short chaos campaign (tests/chaos.rs) runs the harness: a
    // dev-dependency; the binary itself never links it.
    binary.push("kvpool-chaos");
    BTreeMap::from([
        ("kvpool-proto", vec![]),
        ("kvpool-format", vec!["kvpool-proto"]),
        ("kvpool-net", vec!["kvpool-proto"]),
        (
            "kvpool-transfer",
            vec!["kvpool-proto", "kvpool-format", "kvpool-net"],
        ),
        // DESIGN: the master handles metadata only, so it links no data plane.
        ("kvpool-master", vec!["kvpool-proto", "kvpool-net"]),
        (
            "kvpool-store",
            vec![
                "kvpool-proto",
                "kvpool-format",
                "kvpool-net",
                "kvpool-transfer",
            ],
        ),
        // A client lends memory through an embedded store.
        (
            "kvpool-client",
            vec![
                "kvpool-proto",
                "kvpool-format",
                "kvpool-net",
                "kvpool-transfer",
                "kvpool-store",
            ],
        ),
        ("kvpool", binary),
        ("kvpool-python", LIBS.to_vec()),
        ("rbg", vec![]),
        // The chaos harness drives the pool as a client and runs the
        // binaries as processes: it links no server crate.
        (
            "kvpool-chaos",
            vec!["kvpool-proto", "kvpool-net", "kvpool-client"],
        ),
        // Fuzz targets call every decoder of untrusted bytes, the master's
        // HTTP services and rbg's YAML among them; nothing depends on it.
        (
            "kvpool-fuzz",
            vec![
                "kvpool-proto",
                "kvpool-format",
                "kvpool-net",
                "kvpool-master",
                "rbg",
            ],
        ),
    ])
}

/// Workspace crate name -> the workspace crates it depends on (any kind).
fn workspace_deps() -> BTreeMap<String, BTreeSet<String>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .arg("--manifest-path")
        .arg(&root)
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: Value = serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON");
    let packages = meta["packages"].as_array().expect("packages list");
    let names: BTreeSet<String> = packages
        .iter()
        .map(|p| p["name"].as_str().expect("package name").to_string())
        .collect();
    packages
        .iter()
        .map(|p| {
            let deps = p["dependencies"]
                .as_array()
                .expect("dependencies list")
                .iter()
                .map(|d| d["name"].as_str().expect("dependency name").to_string())
                .filter(|d| names.contains(d))
                .collect();
            (p["name"].as_str().unwrap().to_string(), deps)
        })
        .collect()
}

/// Every rule broken by `deps`, one line each.
fn violations(
    deps: &BTreeMap<String, BTreeSet<String>>,
    rules: &BTreeMap<&str, Vec<&str>>,
) -> Vec<String> {
    let mut out = Vec::new();
    for (krate, uses) in deps {
        let Some(allowed) = rules.get(krate.as_str()) else {
            out.push(format!(
                "{krate} has no dependency rule: add it to docs/architecture.md and this test"
            ));
            continue;
        };
        for dep in uses {
            if !allowed.contains(&dep.as_str()) {
                out.push(format!("{krate} must not depend on {dep}"));
            }
        }
    }
    out
}

#[test]
fn workspace_dependencies_follow_the_rules() {
    let deps = workspace_deps();
    // The test must see the real workspace, not an empty or partial one.
    for krate in rules().keys() {
        assert!(deps.contains_key(*krate), "{krate} is not in the workspace");
    }
    let broken = violations(&deps, &rules());
    assert!(
        broken.is_empty(),
        "dependency rules broken:\n{}",
        broken.join("\n")
    );
}

#[test]
fn a_forbidden_dependency_is_reported() {
    let mut deps = BTreeMap::new();
    deps.insert(
        "kvpool-master".to_string(),
        BTreeSet::from(["kvpool-net".to_string(), "kvpool-transfer".to_string()]),
    );
    deps.insert("kvpool-new".to_string(), BTreeSet::new());
    assert_eq!(
        violations(&deps, &rules()),
        [
            "kvpool-master must not depend on kvpool-transfer",
            "kvpool-new has no dependency rule: add it to docs/architecture.md and this test",
        ]
    );
}
