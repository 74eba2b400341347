//! Who may ask what: the roles a peer proves in the handshake, the plane
//! (server) each request belongs to, and the check every server runs before
//! it looks at a request. Each opcode declares its plane and the role it
//! needs in the one table in [`crate::frame`] (`opcodes!`): an opcode cannot
//! exist without a policy, and nothing is open by default.

use std::fmt;

use crate::{Code, KvError, KvResult, Opcode};

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

impl Opcode {
    /// Admits this request on `plane` from a peer that proved `peer`: it
    /// must belong to that plane (`NOT_SUPPORTED` otherwise) and the peer
    /// must hold at least the role the table gives it (`UNAUTHORIZED`).
    /// Handshake requests are never admitted: they come first, once.
    pub fn admit(self, plane: Plane, peer: Role) -> KvResult<()> {
        if self.plane() != plane || plane == Plane::Handshake {
            return Err(KvError::new(
                Code::NotSupported,
                format!("{} is not served by the {}", self.name(), plane.name()),
            ));
        }
        let needs = self.needs();
        if peer >= needs {
            return Ok(());
        }
        Err(KvError::new(
            Code::Unauthorized,
            format!(
                "{} takes the {needs} key; this connection proved {peer}",
                self.name()
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_request_has_a_plane_and_a_role_and_is_refused_elsewhere() {
        for &op in Opcode::ALL {
            let plane = op.plane();
            for other in [Plane::Handshake, Plane::Data, Plane::Control] {
                if other != plane || other == Plane::Handshake {
                    let e = op.admit(other, Role::Admin).unwrap_err();
                    assert_eq!(e.code, Code::NotSupported, "{op:?} on {other:?}");
                }
            }
            if plane == Plane::Handshake {
                continue;
            }
            for peer in Role::ALL {
                let r = op.admit(plane, peer);
                assert_eq!(r.is_ok(), peer >= op.needs(), "{op:?} from {peer}");
                if let Err(e) = r {
                    assert_eq!(e.code, Code::Unauthorized);
                    assert!(e.message.contains(op.needs().name()), "{e}");
                }
            }
        }
    }

    #[test]
    fn what_only_stores_and_operators_may_ask_is_closed_to_clients() {
        for op in [
            Opcode::MountSegment,
            Opcode::ReportObjects,
            Opcode::UnmountSegment,
            Opcode::DrainSegment,
            Opcode::Invalidate,
            Opcode::TierMove,
        ] {
            assert_eq!(op.needs(), Role::Store, "{op:?}");
        }
        for op in [Opcode::RemoveAll, Opcode::RemoveByRegex] {
            assert_eq!(op.needs(), Role::Admin, "{op:?}");
        }
    }
}
