//! Names of what a group creates (RBG.md §2) and the DNS-label rule they obey.
//!
//! A leaf module: validation checks that the names it will derive are legal
//! and discovery derives them, so the scheme lives in one place neither of
//! them owns.

/// Name of instance `index` of `role` in `group`: `g-r-i`.
pub fn instance_name(group: &str, role: &str, index: u32) -> String {
    format!("{group}-{role}-{index}")
}

/// Name of the role's (headless) service: `s-g-r`.
pub fn service_name(group: &str, role: &str) -> String {
    format!("s-{group}-{role}")
}

/// Host name of an instance: `g-r-i.s-g-r`.
pub fn instance_host(group: &str, role: &str, index: u32) -> String {
    format!(
        "{}.{}",
        instance_name(group, role, index),
        service_name(group, role)
    )
}

/// True when `s` is an RFC 1123 DNS label (what Kubernetes requires of names).
pub fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// The validation message for a name that is not a DNS label (`what` says
/// which name), or `None` when it is one.
pub fn dns_problem(what: &str, s: &str) -> Option<String> {
    if is_dns_label(s) {
        None
    } else if s.is_empty() {
        Some(format!("{what}: name is empty"))
    } else {
        Some(format!(
            "{what}: {s:?} is not a DNS label (lowercase letters, digits and '-', starting and ending with a letter or digit, at most 63 characters)"
        ))
    }
}

/// True when `s` is a Kubernetes label key (`[prefix/]name`: the prefix a
/// DNS subdomain of at most 253 characters, the name at most 63 of
/// alphanumerics, `-`, `_` and `.`, starting and ending alphanumeric).
pub fn is_label_key(s: &str) -> bool {
    let (prefix, name) = match s.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    let name_ok = {
        let b = name.as_bytes();
        !b.is_empty()
            && b.len() <= 63
            && b.iter()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
    };
    let prefix_ok = prefix.is_none_or(|p| p.len() <= 253 && p.split('.').all(is_dns_label));
    name_ok && prefix_ok
}
