//! Fuzz targets for every decoder of untrusted bytes in kvpool: frames and
//! messages, object headers, superblocks and segment images, the limits and
//! unit parsers, the master's HTTP services, and rbg's YAML and control JSON.
//!
//! Each target is a plain `fn(&[u8])` that must never panic, abort or hang on
//! any input: a decode error is fine, a panic is a bug. Where a decode
//! succeeds, the targets also check a property (a re-encoded message decodes
//! to the same value, a found object is really there), so they catch wrong
//! answers too. The same functions run under libFuzzer (`fuzz/`, nightly) and
//! under the bounded stable-Rust run of `tests/bounded.rs`; see
//! `docs/fuzzing.md`.

mod format;
mod http;
mod rbg_spec;
mod text;
mod wire;

pub use format::{object_header, segment, superblock};
pub use http::http;
pub use rbg_spec::{rbg_control, rbg_spec};
pub use text::validators;
pub use wire::{frame, message, message_selector};

/// A fuzz target: any bytes in, a panic only on a bug.
pub type Target = fn(&[u8]);

/// Every target by name; the name is also its corpus directory
/// (`fuzz/corpus/<name>`) and its cargo-fuzz binary.
pub const TARGETS: &[(&str, Target)] = &[
    ("frame", frame),
    ("message", message),
    ("object_header", object_header),
    ("superblock", superblock),
    ("segment", segment),
    ("validators", validators),
    ("http", http),
    ("rbg_spec", rbg_spec),
    ("rbg_control", rbg_control),
];
