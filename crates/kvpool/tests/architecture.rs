//! The workspace's dependency rules (docs/architecture.md), checked against
//! what the manifests actually say. A crate that gains a forbidden
//! dependency (the master linking the data plane, a core crate linking the
//! binary) fails here, not in review.
//!
//! Reads `cargo metadata --no-deps`: only the workspace's own manifests,
//! so it needs no network and no build. Normal, dev and build dependencies
//! all count: a test-only arrow still couples the crates.
//!
//! Inside each library crate, the top-level modules (the crate root's
//! `mod x;` declarations) must form an acyclic graph too, read from the
//! sources: a module that names `crate::other` depends on `other`. A cycle
//! means neither module can be understood, tested or moved without the
//! other, so it fails here with the path and the line making each edge.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fs;
use std::path::{Path, PathBuf};
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
    "kvpool-engine",
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
        // The transfer engine moves bytes between processes' registered
        // memory: networking only, no segments, no object format.
        ("kvpool-engine", vec!["kvpool-proto", "kvpool-net"]),
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

/// The workspace's root directory.
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `cargo metadata --no-deps` of the workspace, parsed.
fn metadata() -> Value {
    let root = workspace_root().join("Cargo.toml");
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
    serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON")
}

/// Workspace crate name -> the workspace crates it depends on (any kind).
fn workspace_deps() -> BTreeMap<String, BTreeSet<String>> {
    let meta = metadata();
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

/// Where a module edge comes from: the first file and line that makes it.
#[derive(Clone, Debug, PartialEq)]
struct Site {
    /// The file, relative to the workspace root.
    file: String,
    /// 1-based line number.
    line: usize,
}

/// One crate's top-level modules: module -> the modules it uses, and where.
type ModuleGraph = BTreeMap<String, BTreeMap<String, Site>>;

/// Every workspace library crate: package name -> its crate root file.
fn library_roots(meta: &Value) -> BTreeMap<String, PathBuf> {
    let mut out = BTreeMap::new();
    for p in meta["packages"].as_array().expect("packages list") {
        for t in p["targets"].as_array().expect("targets list") {
            let kinds = t["kind"].as_array().expect("target kinds");
            // `rlib` and `cdylib`: kvpool-python's library is both.
            let is_lib = kinds
                .iter()
                .any(|k| matches!(k.as_str(), Some("lib" | "rlib" | "cdylib" | "dylib")));
            if is_lib {
                let name = p["name"].as_str().expect("package name").to_string();
                let root = t["src_path"].as_str().expect("target src_path");
                out.insert(name, PathBuf::from(root));
            }
        }
    }
    out
}

/// Whether `c` can be part of an identifier.
fn ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// `text` with its `//` and `/* */` comments (doc comments included)
/// blanked, so a path named in prose makes no edge. Newlines stay, so line
/// numbers still hold, and string literals stay: derive attributes name
/// paths in strings (`status = "crate::status::RbgStatus"`), and those are
/// real dependencies. Strings and char literals are stepped over whole so
/// that a `//` or `'"'` inside one starts nothing.
fn strip_comments(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        let rest = &text[i..];
        let at_word = i == 0 || !ident(b[i - 1]);
        let end = if rest.starts_with("//") {
            i + rest.find('\n').unwrap_or(rest.len())
        } else if rest.starts_with("/*") {
            // Block comments nest in Rust.
            let (mut depth, mut j) = (0usize, i);
            while j < b.len() {
                if b[j..].starts_with(b"/*") {
                    depth += 1;
                    j += 2;
                } else if b[j..].starts_with(b"*/") {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            j
        } else {
            let keep = match raw_string_len(rest).filter(|_| at_word) {
                Some(n) => n,
                None if b[i] == b'"' => string_len(rest),
                None if b[i] == b'\'' => char_literal_len(rest).unwrap_or(1),
                // One whole char (sources are UTF-8).
                None => rest.chars().next().map_or(1, char::len_utf8),
            };
            out.push_str(&rest[..keep]);
            i += keep;
            continue;
        };
        out.extend(
            text[i..end]
                .chars()
                .map(|c| if c == '\n' { '\n' } else { ' ' }),
        );
        i = end;
    }
    out
}

/// The length of the raw string literal (`r"…"`, `br#"…"#`) `s` opens.
fn raw_string_len(s: &str) -> Option<usize> {
    let after = s.strip_prefix("br").or_else(|| s.strip_prefix('r'))?;
    let hashes = after.len() - after.trim_start_matches('#').len();
    let body = after[hashes..].strip_prefix('"')?;
    let close = format!("\"{}", "#".repeat(hashes));
    let open = s.len() - body.len();
    Some(
        body.find(&close)
            .map_or(s.len(), |e| open + e + close.len()),
    )
}

/// The length of the string literal `s` opens (at its `"`).
fn string_len(s: &str) -> usize {
    let b = s.as_bytes();
    let mut j = 1;
    while j < b.len() && b[j] != b'"' {
        j += if b[j] == b'\\' { 2 } else { 1 };
    }
    // An escape skips one byte; a later `"` byte still starts no UTF-8
    // sequence, so the end is always a char boundary.
    (j + 1).min(b.len())
}

/// The length of the char literal `s` opens ('x', '\n', '\u{1F600}'); none
/// for a lifetime ('a).
fn char_literal_len(s: &str) -> Option<usize> {
    let body = &s[1..];
    let len = if body.starts_with('\\') {
        body.get(2..)?.find('\'')? + 2
    } else {
        body.chars().next()?.len_utf8()
    };
    body[len..].starts_with('\'').then_some(len + 2)
}

/// The module names `code` (comments stripped) reaches at the crate root,
/// each with its 1-based line: the segment after `crate::` (every first
/// segment of a `crate::{a, b::x}` group), and after `super::` repeated
/// `depth` times, `depth` being how far below the root the file's module
/// sits (1 for `src/a.rs` and `src/a/mod.rs`). Inline modules (`mod tests
/// { use super::… }`) are not counted in the depth: none reaches a
/// top-level module that way today.
fn root_mentions(code: &str, depth: usize) -> Vec<(String, usize)> {
    const SUPER: &[u8] = b"super::";
    let b = code.as_bytes();
    let line_at = |at: usize| code[..at].matches('\n').count() + 1;
    let word_at = |at: usize| {
        let len = b[at..].iter().take_while(|&&c| ident(c)).count();
        &code[at..at + len]
    };
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if i > 0 && ident(b[i - 1]) {
            i += 1;
            continue;
        }
        let after = if b[i..].starts_with(b"crate::") {
            i + "crate::".len()
        } else if b[i..].starts_with(SUPER) {
            let mut j = i;
            while b[j..].starts_with(SUPER) {
                j += SUPER.len();
            }
            if (j - i) / SUPER.len() != depth {
                i = j;
                continue;
            }
            j
        } else {
            i += 1;
            continue;
        };
        if b.get(after) != Some(&b'{') {
            let w = word_at(after);
            if !w.is_empty() {
                out.push((w.to_string(), line_at(after)));
            }
            i = after + w.len();
            continue;
        }
        // A group: the first segment of each item at its top level.
        let (mut level, mut item_start, mut j) = (0usize, false, after);
        while j < b.len() {
            match b[j] {
                b'{' => {
                    level += 1;
                    item_start = level == 1;
                }
                b'}' => {
                    level -= 1;
                    if level == 0 {
                        break;
                    }
                }
                b',' if level == 1 => item_start = true,
                c if c.is_ascii_whitespace() => {}
                c if level == 1 && item_start && ident(c) => {
                    let w = word_at(j);
                    out.push((w.to_string(), line_at(j)));
                    item_start = false;
                    j += w.len();
                    continue;
                }
                _ if level == 1 => item_start = false,
                _ => {}
            }
            j += 1;
        }
        i = j;
    }
    out
}

/// The `mod x;` declarations of a crate root (inline `mod x { … }` holds
/// no files of its own, so it is no top-level module here).
fn declared_modules(root: &str) -> Vec<String> {
    // Tokens: identifiers and single punctuation chars.
    let code = strip_comments(root);
    let mut tokens = Vec::new();
    let mut rest = code.as_str();
    while let Some(c) = rest.chars().next() {
        let len = if c.is_ascii_alphanumeric() || c == '_' {
            rest.bytes().take_while(|&c| ident(c)).count()
        } else {
            c.len_utf8()
        };
        if !c.is_whitespace() {
            tokens.push(&rest[..len]);
        }
        rest = &rest[len..];
    }
    tokens
        .windows(3)
        .filter(|w| w[0] == "mod" && w[2] == ";")
        .map(|w| w[1].to_string())
        .collect()
}

/// Every `.rs` file under `dir`, sorted, each with how far below the crate
/// root its module sits; `depth` is that of `dir`'s own module (`mod.rs`).
fn rust_files(dir: &Path, depth: usize, out: &mut Vec<(PathBuf, usize)>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let mut paths: Vec<PathBuf> = entries.map(|e| e.expect("dir entry").path()).collect();
    paths.sort();
    for p in paths {
        if p.is_dir() {
            rust_files(&p, depth + 1, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            let below = if p.file_name().is_some_and(|n| n == "mod.rs") {
                depth
            } else {
                depth + 1
            };
            out.push((p, below));
        }
    }
}

/// The module graph of the library whose root file is `root`. Test files
/// (`tests.rs`, `tests/`) count like any other: they make no false edge
/// today, and a test-only arrow still couples two modules.
fn module_graph(root: &Path, workspace: &Path) -> ModuleGraph {
    let text = fs::read_to_string(root).expect("read crate root");
    let src = root.parent().expect("crate root has a directory");
    let modules = declared_modules(&text);
    let mut graph = ModuleGraph::new();
    for m in &modules {
        let mut files = Vec::new();
        let file = src.join(format!("{m}.rs"));
        if file.is_file() {
            files.push((file, 1));
        }
        rust_files(&src.join(m), 1, &mut files);
        let uses = graph.entry(m.clone()).or_default();
        for (file, depth) in files {
            let code = strip_comments(&fs::read_to_string(&file).expect("read source"));
            let shown = file.strip_prefix(workspace).unwrap_or(&file);
            for (to, line) in root_mentions(&code, depth) {
                if &to != m && modules.contains(&to) {
                    uses.entry(to).or_insert_with(|| Site {
                        file: shown.display().to_string(),
                        line,
                    });
                }
            }
        }
    }
    graph
}

/// The shortest cycle of `graph` as the path `a -> b -> … -> a`, each edge
/// with its site, or `None` when the graph is acyclic. Shortest, because
/// that is the one to read first: a longer cycle often shares its back edge.
fn find_cycle(graph: &ModuleGraph) -> Option<String> {
    let mut best: Option<Vec<&str>> = None;
    for start in graph.keys().map(String::as_str) {
        // Breadth first, so the first way back to `start` is the shortest.
        let mut parent: BTreeMap<&str, &str> = BTreeMap::new();
        let mut queue = VecDeque::from([start]);
        'search: while let Some(node) = queue.pop_front() {
            for next in graph.get(node).into_iter().flat_map(|e| e.keys()) {
                if next == start {
                    let mut path = vec![node];
                    while let Some(&up) = parent.get(path[path.len() - 1]) {
                        path.push(up);
                    }
                    path.reverse();
                    path.push(start);
                    if best.as_ref().is_none_or(|b| path.len() < b.len()) {
                        best = Some(path);
                    }
                    break 'search;
                }
                if !parent.contains_key(next.as_str()) {
                    parent.insert(next, node);
                    queue.push_back(next);
                }
            }
        }
    }
    let cycle = best?;
    let mut out = cycle.join(" -> ");
    for pair in cycle.windows(2) {
        let site = &graph[pair[0]][pair[1]];
        out.push_str(&format!(
            "\n    {} -> {}: {}:{}",
            pair[0], pair[1], site.file, site.line
        ));
    }
    Some(out)
}

#[test]
fn top_level_modules_are_acyclic() {
    let meta = metadata();
    let workspace = PathBuf::from(meta["workspace_root"].as_str().expect("workspace_root"));
    let libs = library_roots(&meta);
    // The test must see the real workspace's libraries.
    for krate in ["kvpool-proto", "kvpool-net", "kvpool-master", "rbg"] {
        assert!(libs.contains_key(krate), "no library {krate}");
    }
    let mut broken = Vec::new();
    for (krate, root) in &libs {
        let graph = module_graph(root, &workspace);
        if let Some(cycle) = find_cycle(&graph) {
            broken.push(format!("{krate}: {cycle}"));
        }
    }
    assert!(
        broken.is_empty(),
        "top-level module cycles (move the item behind one edge to the module \
         that should own it, or to a leaf module):\n{}",
        broken.join("\n")
    );
}

#[test]
fn mentions_in_code_count_and_comments_do_not() {
    let code = strip_comments(
        "//! crate::doc\n\
         use crate::{a, b::x, c::{d, e}};\n\
         /// crate::f and /* crate::g */\n\
         #[kube(status = \"crate::h::S\")]\n\
         let q = '\"'; let u = \"http://x\"; crate::i::f(); super::j::k();\n\
         let r = r#\"crate::l\"#; super::super::m(); my_crate::n();\n",
    );
    let names = |depth| {
        root_mentions(&code, depth)
            .into_iter()
            .map(|(m, line)| format!("{m}:{line}"))
            .collect::<Vec<_>>()
    };
    assert_eq!(names(1), ["a:2", "b:2", "c:2", "h:4", "i:5", "j:5", "l:6"]);
    assert_eq!(names(2), ["a:2", "b:2", "c:2", "h:4", "i:5", "l:6", "m:6"]);
    assert_eq!(
        declared_modules("pub mod a;\nmod b; // mod z;\n#[cfg(test)] mod c;\nmod d {}\n"),
        ["a", "b", "c"]
    );
}

#[test]
fn a_module_cycle_is_reported_with_its_edges() {
    let site = |file: &str, line| Site {
        file: file.to_string(),
        line,
    };
    let mut graph = ModuleGraph::new();
    graph.entry("graph".into()).or_default();
    // Two cycles through `spec -> status`: the shorter one is reported.
    let planner = graph.entry("planner".into()).or_default();
    planner.insert("revision".into(), site("src/planner.rs", 30));
    planner.insert("spec".into(), site("src/planner.rs", 31));
    graph
        .entry("revision".into())
        .or_default()
        .insert("spec".into(), site("src/revision.rs", 14));
    graph
        .entry("spec".into())
        .or_default()
        .insert("status".into(), site("src/spec/v2.rs", 25));
    graph
        .entry("status".into())
        .or_default()
        .insert("planner".into(), site("src/status.rs", 10));
    assert_eq!(
        find_cycle(&graph).unwrap(),
        "planner -> spec -> status -> planner\n    \
         planner -> spec: src/planner.rs:31\n    \
         spec -> status: src/spec/v2.rs:25\n    \
         status -> planner: src/status.rs:10"
    );
    graph.get_mut("status").unwrap().clear();
    assert_eq!(find_cycle(&graph), None);
}
