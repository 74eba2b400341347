//! What a storage process serves, for an engine attaching on its host.

use serde::{Deserialize, Serialize};

use super::*;

/// Asks a data server what it serves and which master it answers to (an
/// engine attaching to a storage process on its host).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreAbout {}

/// What a data server serves.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreAboutReply {
    /// The master its segments are mounted on (as the store was told it).
    pub master: String,
    /// Its segments.
    pub segments: Vec<SegmentInfo>,
}
