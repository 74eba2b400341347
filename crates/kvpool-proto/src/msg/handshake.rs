//! The connection handshake: versions, challenge, proof of a role key.

use serde::{Deserialize, Serialize};

/// First frame on a connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// Newest version the sender speaks.
    pub version: u32,
    /// Oldest version the sender speaks.
    pub min_version: u32,
    /// Who is calling, for logs ("client", "store", "cli").
    pub role: String,
    /// Fresh randomness from the caller, bound into both proofs of [`Auth`].
    pub nonce: [u8; 16],
}

/// Answer to [`Hello`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HelloReply {
    /// Version both sides will speak.
    pub version: u32,
    /// What answered ("master", "store").
    pub server: String,
    /// Present when the server requires an [`Auth`] before anything else.
    pub challenge: Option<Challenge>,
}

/// A server's demand for proof of a role key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Challenge {
    /// Fresh randomness from the server.
    pub nonce: [u8; 16],
    /// The highest role this server can verify (its own key's role).
    pub max_role: u8,
}

/// Proof that the caller holds the key of `role`: a MAC over both nonces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Auth {
    /// The role claimed (1 client, 2 store, 3 admin).
    pub role: u8,
    /// The caller's proof.
    pub proof: [u8; 32],
}

/// Fields of [`Auth`] since protocol 8: the tenant whose key proves the
/// client role (see [`crate::tenant`]); none for a role key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthTenant {
    /// The tenant's name.
    pub tenant: Option<String>,
}

impl crate::compat::Trailer for AuthTenant {
    const SINCE: u32 = 8;
}

/// Answer to [`Auth`]: the server's own proof of the same key, so a caller
/// never talks to a server that does not hold the secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthReply {
    /// The server's proof.
    pub proof: [u8; 32],
}
