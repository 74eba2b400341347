//! JSON schemas for the fields whose Rust type is not what the API server
//! should validate: Pod templates and patches are kept open
//! (`x-kubernetes-preserve-unknown-fields`) so that a cluster never prunes a
//! Pod field this crate does not model; rbg itself checks them when it loads
//! a group.

use schemars::{json_schema, Schema, SchemaGenerator};

/// An open object: a Pod template (the API server keeps every field).
pub fn pod_template(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// A value of any shape kept as written (strategic-merge patches,
/// component templates): no type, as upstream declares them.
pub fn preserve_unknown(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// `rollingUpdate.type`: a string, as upstream declares it, so that every
/// value upstream stores (v1alpha1's `Recreate` and `""` too) can be stored
/// here; `rbg` checks the value when it loads the group.
pub fn update_type(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string"
    })
}

/// A list of open objects (container overrides).
pub fn preserve_unknown_list(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
    })
}
