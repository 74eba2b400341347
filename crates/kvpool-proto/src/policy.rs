//! Who may ask what: the roles a peer proves in the handshake and the
//! planes (servers) requests belong to. Each opcode declares its plane and
//! the role it needs in the request table ([`crate::requests`]), which
//! also holds the check every server runs before it looks at a request
//! ([`crate::Opcode::admit`]).

use std::fmt;

/// What an authenticated peer may do; each role may do everything the roles
/// below it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// An engine: puts, gets, removes of its own keys, status.
    Client = 1,
    /// A storage node: lends segments, reports inventories, takes
    /// invalidations; also everything a client may.
    Store = 2,
    /// An operator: remove-all, remove-by-regex, drain, the HTTP admin API.
    Admin = 3,
}

impl Role {
    /// Every role, lowest first.
    pub const ALL: [Role; 3] = [Role::Client, Role::Store, Role::Admin];

    /// The wire number.
    pub fn as_u8(self) -> u8 {
        self as u8
    }

    /// Decodes a wire number.
    pub fn from_u8(v: u8) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.as_u8() == v)
    }

    /// Lower-case name, as in secret files and logs.
    pub fn name(self) -> &'static str {
        match self {
            Role::Client => "client",
            Role::Store => "store",
            Role::Admin => "admin",
        }
    }

    /// Parses a name written by [`Role::name`].
    pub fn parse(s: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.name() == s)
    }

    /// The role just below this one (keys derive downwards).
    pub fn below(self) -> Option<Role> {
        match self {
            Role::Client => None,
            Role::Store => Some(Role::Client),
            Role::Admin => Some(Role::Store),
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which server answers a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plane {
    /// The connection handshake, before any request (both servers).
    Handshake,
    /// A storage node's data port: bytes in and out of segments.
    Data,
    /// The master: metadata, membership, placement.
    Control,
}

impl Plane {
    /// Lower-case name, for errors and logs.
    pub fn name(self) -> &'static str {
        match self {
            Plane::Handshake => "handshake",
            Plane::Data => "data plane",
            Plane::Control => "master",
        }
    }
}
