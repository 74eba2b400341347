//! The dependency graph of a group's roles: levels and cycle detection.
//!
//! A leaf module (it depends on nothing else in the crate) so that spec
//! validation, which rejects cycles, and the planner, which orders work by
//! level, share one implementation without depending on each other.

use std::collections::BTreeMap;

/// A problem with the dependency graph.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GraphError {
    /// A role depends on a role that does not exist.
    #[error("role {role:?}: dependencies: unknown role {dependency:?}")]
    UnknownDependency {
        /// The role declaring the dependency.
        role: String,
        /// The missing role.
        dependency: String,
    },
    /// The dependencies loop; the roles are listed along the loop.
    #[error("dependency cycle: {}", cycle_text(.0))]
    Cycle(Vec<String>),
}

fn cycle_text(c: &[String]) -> String {
    let mut parts: Vec<&str> = c.iter().map(String::as_str).collect();
    if let Some(first) = c.first() {
        parts.push(first);
    }
    parts.join(" -> ")
}

/// Sorts roles into levels: level 0 has no dependencies, and a role's level
/// is 1 + the highest level of its dependencies. Within a level, roles keep
/// the order of `roles`. `roles` is `(name, dependencies)`.
pub fn levels(roles: &[(&str, Vec<&str>)]) -> Result<Vec<Vec<String>>, GraphError> {
    let index: BTreeMap<&str, usize> = roles
        .iter()
        .enumerate()
        .map(|(i, (n, _))| (*n, i))
        .collect();
    for (name, deps) in roles {
        for d in deps {
            if !index.contains_key(d) {
                return Err(GraphError::UnknownDependency {
                    role: name.to_string(),
                    dependency: d.to_string(),
                });
            }
        }
    }
    // Depth-first search with colours; the grey path is the cycle when a
    // grey node is met again.
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        White,
        Grey,
        Black,
    }
    let n = roles.len();
    let mut mark = vec![Mark::White; n];
    let mut level = vec![0usize; n];
    let mut path: Vec<usize> = Vec::new();

    fn visit(
        v: usize,
        roles: &[(&str, Vec<&str>)],
        index: &BTreeMap<&str, usize>,
        mark: &mut [Mark],
        level: &mut [usize],
        path: &mut Vec<usize>,
    ) -> Result<(), GraphError> {
        mark[v] = Mark::Grey;
        path.push(v);
        let mut lv = 0;
        for d in &roles[v].1 {
            let Some(&u) = index.get(d) else { continue };
            match mark[u] {
                Mark::Grey => {
                    let start = path.iter().position(|&p| p == u).unwrap_or(0);
                    let cycle = path[start..]
                        .iter()
                        .map(|&i| roles[i].0.to_string())
                        .collect();
                    return Err(GraphError::Cycle(cycle));
                }
                Mark::White => visit(u, roles, index, mark, level, path)?,
                Mark::Black => {}
            }
            lv = lv.max(level[u] + 1);
        }
        level[v] = lv;
        mark[v] = Mark::Black;
        path.pop();
        Ok(())
    }

    for v in 0..n {
        if mark[v] == Mark::White {
            visit(v, roles, &index, &mut mark, &mut level, &mut path)?;
        }
    }
    let depth = level.iter().copied().max().map_or(0, |m| m + 1);
    let mut out = vec![Vec::new(); depth];
    for (i, (name, _)) in roles.iter().enumerate() {
        out[level[i]].push(name.to_string());
    }
    Ok(out)
}

/// [`levels`] of items given as `(name, dependencies)`, the way roles hold
/// their dependencies (owned names).
pub fn levels_of<'a>(
    roles: impl IntoIterator<Item = (&'a str, &'a [String])>,
) -> Result<Vec<Vec<String>>, GraphError> {
    let edges: Vec<(&str, Vec<&str>)> = roles
        .into_iter()
        .map(|(name, deps)| (name, deps.iter().map(String::as_str).collect()))
        .collect();
    levels(&edges)
}
