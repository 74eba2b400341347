//! No panics on any input: spec loading, `$(VAR)` expansion, host and path
//! rewriting and strategic merge over arbitrary text.

use proptest::prelude::*;
use rbg::discovery::{expand, rewrite_hosts, rewrite_paths};

const BASE: &str = "apiVersion: workloads.x-k8s.io/v1alpha1
kind: RoleBasedGroup
metadata: {name: g}
spec:
  roles:
  - name: a
    replicas: 2
    template: {spec: {containers: [{name: c, command: [x]}]}}
";

proptest! {
    #[test]
    fn load_never_panics(text in "\\PC{0,400}") {
        let _ = rbg::spec::load(&text);
    }

    #[test]
    fn load_of_mutated_spec_never_panics(at in 0usize..BASE.len(), junk in "[-a-z0-9:{}\\[\\]%\" \n]{0,12}") {
        let mut s = BASE.to_string();
        let at = (0..=at).rev().find(|i| s.is_char_boundary(*i)).unwrap_or(0);
        s.insert_str(at, &junk);
        let _ = rbg::spec::load(&s);
    }

    #[test]
    fn text_rewriting_never_panics(s in "\\PC{0,80}", host in "[a-z.-]{0,10}", path in "/[a-z/]{0,6}") {
        let lookup = |n: &str| if n.len().is_multiple_of(2) { Some(format!("<{n}>")) } else { None };
        let _ = expand(&s, &lookup);
        let _ = rewrite_hosts(&s, &[(host.clone(), "127.1.1.1".to_string())]);
        let _ = rewrite_paths(&s, &[(path, "/tmp/v".to_string())]);
    }

    #[test]
    fn merge_never_panics(a in "\\PC{0,120}", b in "\\PC{0,120}") {
        if let (Ok(x), Ok(y)) = (serde_yaml::from_str::<serde_yaml::Value>(&a), serde_yaml::from_str::<serde_yaml::Value>(&b)) {
            let _ = rbg::merge::strategic_merge(&x, &y);
        }
    }
}

#[test]
fn base_loads() {
    assert!(rbg::spec::load(BASE).is_ok());
}
