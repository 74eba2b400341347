//! `fieldRef.fieldPath` values (the Downward API) this crate understands.
//!
//! A leaf module: spec validation rejects unsupported paths at load time and
//! discovery resolves them at launch, so both read the same list from here.

/// Checks that a `fieldRef.fieldPath` is one this crate can resolve.
pub fn check_field_path(path: &str) -> Result<(), String> {
    match path {
        "metadata.name"
        | "metadata.namespace"
        | "metadata.uid"
        | "metadata.labels"
        | "metadata.annotations"
        | "status.podIP"
        | "status.podIPs"
        | "status.hostIP"
        | "status.hostIPs"
        | "spec.nodeName"
        | "spec.serviceAccountName" => Ok(()),
        _ if subscript(path, "metadata.labels").is_some()
            || subscript(path, "metadata.annotations").is_some() =>
        {
            Ok(())
        }
        _ => Err(format!("fieldRef.fieldPath {path:?} is not supported")),
    }
}

/// `metadata.labels['k']` → `k` (single or double quotes).
pub(crate) fn subscript<'a>(path: &'a str, prefix: &str) -> Option<&'a str> {
    let rest = path
        .strip_prefix(prefix)?
        .strip_prefix('[')?
        .strip_suffix(']')?;
    rest.strip_prefix('\'')
        .and_then(|r| r.strip_suffix('\''))
        .or_else(|| rest.strip_prefix('"').and_then(|r| r.strip_suffix('"')))
}
