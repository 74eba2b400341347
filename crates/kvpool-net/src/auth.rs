//! Authentication: the cluster secret, the role keys derived from it, and the
//! proofs exchanged in the handshake.
//!
//! One secret per cluster; each role's key derives from the role above it,
//! so a process holding a key can prove that role or any lower one and can
//! verify exactly those: admin (the cluster secret) → store → client. The
//! master holds the admin key, a store the store key, an engine the client
//! key. A key never crosses the wire: each side proves it with an HMAC over
//! both sides' fresh nonces, under a label that differs per side so one
//! side's proof is never valid as the other's.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use hmac::{Hmac, Mac};
use kvpool_proto::{tenant, Code, KvError, KvResult};
use sha2::{Digest, Sha256};

use crate::tls::{Tls, TlsFiles, CERT_ENV, KEY_ENV};

type HmacSha256 = Hmac<Sha256>;

/// Environment variable naming a file that holds a secret.
pub const SECRET_FILE_ENV: &str = "KVPOOL_SECRET_FILE";
/// Environment variable holding a secret itself.
pub const SECRET_ENV: &str = "KVPOOL_SECRET";
/// Environment variable that allows serving off loopback without a secret.
pub const INSECURE_ENV: &str = "KVPOOL_INSECURE";
/// Shortest cluster secret accepted, in bytes.
pub const MIN_SECRET_LEN: usize = 16;

/// What an authenticated peer may do (defined with the request table).
pub use kvpool_proto::Role;

/// A role key: what one process holds to prove (and verify) its role and
/// every role below it; or a tenant's key, which proves the client role
/// within that tenant's namespace only (see [`kvpool_proto::tenant`]).
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    role: Role,
    tenant: Option<String>,
    key: [u8; 32],
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the key itself: Debug output ends up in logs.
        match &self.tenant {
            Some(t) => write!(f, "Credentials({}@{t})", self.role),
            None => write!(f, "Credentials({})", self.role),
        }
    }
}

impl Credentials {
    /// The admin key of a cluster secret (any text of 16 bytes or more).
    pub fn from_cluster_secret(secret: &[u8]) -> KvResult<Credentials> {
        if secret.len() < MIN_SECRET_LEN {
            return Err(bad_secret(format!(
                "a cluster secret of {} bytes; use at least {MIN_SECRET_LEN} (`kvpool secret new` makes one)",
                secret.len()
            )));
        }
        let key = Sha256::new()
            .chain_update(b"kvpool cluster secret\0")
            .chain_update(secret)
            .finalize()
            .into();
        Ok(Credentials {
            role: Role::Admin,
            tenant: None,
            key,
        })
    }

    /// Parses a secret as written in a secret file: `kvpool-<role>:<64 hex
    /// digits>` or `kvpool-client@<tenant>:<64 hex digits>` (from
    /// [`Credentials::encode`]), or else the text, trimmed, is the cluster
    /// secret itself.
    pub fn parse(text: &str) -> KvResult<Credentials> {
        let text = text.trim();
        let Some((role, hex)) = text
            .strip_prefix("kvpool-")
            .and_then(|rest| rest.split_once(':'))
        else {
            return Credentials::from_cluster_secret(text.as_bytes());
        };
        let (role, tenant) = match role.split_once('@') {
            Some(("client", name)) => {
                tenant::validate_tenant(name).map_err(|e| bad_secret(e.message))?;
                (Role::Client, Some(name.to_string()))
            }
            Some(_) => {
                return Err(bad_secret(format!(
                    "only client keys belong to a tenant, not {role:?}"
                )))
            }
            None => (
                Role::parse(role)
                    .ok_or_else(|| bad_secret(format!("unknown role {role:?} in a role key")))?,
                None,
            ),
        };
        let key = decode_hex(hex).ok_or_else(|| {
            bad_secret(format!(
                "a {role} key must be 64 hex digits after `kvpool-{role}:`"
            ))
        })?;
        Ok(Credentials { role, tenant, key })
    }

    /// Reads a secret file (see [`Credentials::parse`]). Warns when the
    /// file can be read by others than its owner.
    pub fn load(path: &Path) -> KvResult<Credentials> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| bad_secret(format!("cannot read secret file {}: {e}", path.display())))?;
        warn_if_shared(path);
        Credentials::parse(&text)
            .map_err(|e| bad_secret(format!("secret file {}: {}", path.display(), e.message)))
    }

    /// The secret named by the environment: the file in `KVPOOL_SECRET_FILE`,
    /// else the text in `KVPOOL_SECRET`, else none.
    pub fn from_env() -> KvResult<Option<Credentials>> {
        if let Some(path) = std::env::var_os(SECRET_FILE_ENV).filter(|p| !p.is_empty()) {
            return Credentials::load(Path::new(&path)).map(Some);
        }
        match std::env::var(SECRET_ENV) {
            Ok(text) if !text.is_empty() => Credentials::parse(&text).map(Some),
            _ => Ok(None),
        }
    }

    /// Writes the key in the form [`Credentials::parse`] reads.
    pub fn encode(&self) -> String {
        let hex: String = self.key.iter().map(|b| format!("{b:02x}")).collect();
        match &self.tenant {
            Some(t) => format!("kvpool-{}@{t}:{hex}", self.role),
            None => format!("kvpool-{}:{hex}", self.role),
        }
    }

    /// The role this key proves.
    pub fn role(&self) -> Role {
        self.role
    }

    /// The tenant whose key this is; `None` for a role key.
    pub fn tenant(&self) -> Option<&str> {
        self.tenant.as_deref()
    }

    /// The key of tenant `name`, derived from the store key: every server
    /// (a store, the master) can verify every tenant, while a client's key,
    /// a tenant's included, derives no tenant's key.
    pub fn for_tenant(&self, name: &str) -> KvResult<Credentials> {
        tenant::validate_tenant(name)?;
        let store = self.derive(Role::Store).ok_or_else(|| {
            bad_secret(format!(
                "tenant {name:?}'s key derives from the store key or the cluster secret, \
                 not from a {} key",
                self.role
            ))
        })?;
        Ok(Credentials {
            role: Role::Client,
            tenant: Some(name.to_string()),
            key: store.mac(&[b"kvpool tenant key\0", name.as_bytes()]),
        })
    }

    /// The key of `role`, derived from this one; `None` when `role` is above
    /// this key's.
    pub fn derive(&self, role: Role) -> Option<Credentials> {
        let mut c = self.clone();
        while c.role > role {
            let below = c.role.below()?;
            c = Credentials {
                role: below,
                tenant: None,
                key: c.mac(&[b"kvpool role key\0", below.name().as_bytes()]),
            };
        }
        (c.role == role).then_some(c)
    }

    /// A key for other uses (HTTP tokens, capabilities), bound to `label`
    /// and to this key: whoever holds this role's key can derive it.
    pub fn subkey(&self, label: &str) -> [u8; 32] {
        self.mac(&[b"kvpool subkey\0", label.as_bytes()])
    }

    /// The bearer token of this key for the master's HTTP ports
    /// (`Authorization: Bearer <token>`): 64 hex digits, proving this role
    /// without revealing the key.
    pub fn http_token(&self) -> String {
        self.subkey("http bearer")
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// The caller's proof in a handshake.
    pub fn client_proof(&self, client_nonce: &[u8; 16], server_nonce: &[u8; 16]) -> [u8; 32] {
        self.proof(b"kvpool client proof\0", client_nonce, server_nonce)
    }

    /// The server's proof in a handshake.
    pub fn server_proof(&self, client_nonce: &[u8; 16], server_nonce: &[u8; 16]) -> [u8; 32] {
        self.proof(b"kvpool server proof\0", client_nonce, server_nonce)
    }

    /// Checks a proof made by [`Self::client_proof`] (or, with `server`,
    /// [`Self::server_proof`]) in constant time.
    pub fn verify(
        &self,
        server: bool,
        client_nonce: &[u8; 16],
        server_nonce: &[u8; 16],
        proof: &[u8; 32],
    ) -> bool {
        let label: &[u8] = if server {
            b"kvpool server proof\0"
        } else {
            b"kvpool client proof\0"
        };
        self.hmac(&[label, &[self.role.as_u8()], client_nonce, server_nonce])
            .verify_slice(proof)
            .is_ok()
    }

    fn proof(&self, label: &[u8], client_nonce: &[u8; 16], server_nonce: &[u8; 16]) -> [u8; 32] {
        self.mac(&[label, &[self.role.as_u8()], client_nonce, server_nonce])
    }

    fn mac(&self, parts: &[&[u8]]) -> [u8; 32] {
        self.hmac(parts).finalize().into_bytes().into()
    }

    fn hmac(&self, parts: &[&[u8]]) -> HmacSha256 {
        // HMAC takes keys of any length; 32 bytes cannot fail.
        let mut m = <HmacSha256 as Mac>::new_from_slice(&self.key).expect("HMAC key");
        for p in parts {
            // Length-prefixed so no two different part lists hash alike.
            m.update(&(p.len() as u32).to_le_bytes());
            m.update(p);
        }
        m
    }
}

/// How a process authenticates itself and its peers: the key it proves and
/// verifies them with, whether it may serve without one off loopback, and
/// TLS. Cheap to clone: every connection pool holds one.
#[derive(Debug, Clone, Default)]
pub struct Security {
    /// This process's key; `None` serves every peer as admin (or as what
    /// its TLS certificate allows).
    pub credentials: Option<Credentials>,
    /// Listen on non-loopback addresses without a secret anyway.
    pub insecure: bool,
    /// TLS to and from kvpool peers; `None` speaks plaintext.
    pub tls: Option<Tls>,
    /// TLS for `https://` etcd endpoints.
    pub etcd_tls: Option<Arc<rustls::ClientConfig>>,
}

impl Security {
    /// The secret and TLS files named by the environment (see
    /// [`Credentials::from_env`], [`TlsFiles::from_env`]), insecure when
    /// `KVPOOL_INSECURE` says yes ([`crate::tls::yes_no`]).
    pub fn from_env() -> KvResult<Security> {
        let insecure = crate::tls::env_flag(INSECURE_ENV);
        Security::new(Credentials::from_env()?, insecure, &TlsFiles::from_env())
    }

    /// Plaintext, proving `credentials` (when set) and nothing else.
    pub fn with_key(credentials: Option<Credentials>) -> Security {
        Security {
            credentials,
            ..Security::default()
        }
    }

    /// The security of `credentials` and the TLS `files` (loaded and
    /// checked now), with etcd's TLS from `KVPOOL_ETCD_*` or else `files`.
    pub fn new(
        credentials: Option<Credentials>,
        insecure: bool,
        files: &TlsFiles,
    ) -> KvResult<Security> {
        let tls = files.load()?;
        let etcd_files = files.etcd_from_env();
        let etcd_tls = match &tls {
            // Most pools: etcd shares the pool's CA and certificates.
            Some(t) if etcd_files.ca == files.ca && etcd_files.cert == files.cert => {
                Some(t.client_config())
            }
            _ if etcd_files.ca.is_some() => etcd_files.load()?.map(|t| t.client_config()),
            _ => None,
        };
        Ok(Security {
            credentials,
            insecure,
            tls,
            etcd_tls,
        })
    }

    /// Refuses to serve on `ip` without a secret when anyone but this host
    /// could connect: every peer would be trusted with everything. With
    /// TLS, serving needs a certificate.
    pub fn check_listen(&self, ip: std::net::IpAddr, what: &str) -> KvResult<()> {
        if self.tls.as_ref().is_some_and(|t| !t.has_cert()) {
            return Err(KvError::new(
                Code::InvalidParams,
                format!(
                    "serving {what} with TLS needs a certificate: set --tls-cert and \
                     --tls-key ({CERT_ENV}, {KEY_ENV}) as well as --tls-ca"
                ),
            ));
        }
        // Certificates required of every peer authenticate them too.
        let authenticated =
            self.credentials.is_some() || self.tls.as_ref().is_some_and(Tls::requires_client_cert);
        if authenticated || self.insecure || ip.is_loopback() {
            return Ok(());
        }
        Err(KvError::new(
            Code::InvalidParams,
            format!(
                "refusing to serve {what} on {ip} without a secret: anyone who can reach it \
                 could read, forge and delete every object. Set --secret-file (or \
                 {SECRET_FILE_ENV}; `kvpool secret new` makes one), listen on 127.0.0.1, or \
                 pass --insecure ({INSECURE_ENV}=1) to accept the risk"
            ),
        ))
    }
}

/// A fresh random secret for `kvpool secret new`.
pub fn new_cluster_secret() -> String {
    let bytes: [u8; 32] = rand::random();
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("kvpool-admin:{hex}")
}

fn decode_hex(s: &str) -> Option<[u8; 32]> {
    let s = s.as_bytes();
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in s.chunks(2).enumerate() {
        let digits = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(digits, 16).ok()?;
    }
    Some(out)
}

fn bad_secret(msg: String) -> KvError {
    KvError::new(Code::InvalidParams, msg)
}

#[cfg(unix)]
fn warn_if_shared(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(m) = std::fs::metadata(path) {
        if m.permissions().mode() & 0o077 != 0 {
            tracing::warn!(
                path = %path.display(),
                "secret file is readable by others than its owner; chmod 600 it"
            );
        }
    }
}

#[cfg(not(unix))]
fn warn_if_shared(_: &Path) {}

#[cfg(test)]
mod tests {
    use super::*;

    fn admin() -> Credentials {
        Credentials::parse("a cluster secret long enough").unwrap()
    }

    #[test]
    fn keys_derive_downwards_only() {
        let admin = admin();
        let store = admin.derive(Role::Store).unwrap();
        let client = admin.derive(Role::Client).unwrap();
        assert_eq!(store.derive(Role::Client).unwrap(), client);
        assert!(store.derive(Role::Admin).is_none());
        assert!(client.derive(Role::Store).is_none());
        assert_ne!(store.key, client.key);
        assert_ne!(store.key, admin.key);
    }

    #[test]
    fn encoded_keys_parse_back() {
        for role in Role::ALL {
            let c = admin().derive(role).unwrap();
            assert_eq!(Credentials::parse(&c.encode()).unwrap(), c);
            assert_eq!(Credentials::parse(&format!("{}\n", c.encode())).unwrap(), c);
        }
        let fresh = Credentials::parse(&new_cluster_secret()).unwrap();
        assert_eq!(fresh.role(), Role::Admin);
    }

    #[test]
    fn tenant_keys_derive_from_the_client_key_and_prove_one_tenant() {
        let admin = admin();
        let client = admin.derive(Role::Client).unwrap();
        let acme = admin.for_tenant("acme").unwrap();
        let store = admin.derive(Role::Store).unwrap();
        assert_eq!(store.for_tenant("acme").unwrap(), acme);
        assert!(
            client.for_tenant("acme").is_err(),
            "a client key reaches no tenant"
        );
        assert_eq!((acme.role(), acme.tenant()), (Role::Client, Some("acme")));
        assert_eq!(Credentials::parse(&acme.encode()).unwrap(), acme);
        assert!(acme.encode().starts_with("kvpool-client@acme:"));
        assert_eq!(acme.derive(Role::Client).unwrap(), acme);
        assert!(acme.derive(Role::Store).is_none());
        assert!(
            acme.for_tenant("other").is_err(),
            "no tenant key from a tenant's"
        );
        assert!(admin.for_tenant("bad name").is_err());
        let other = admin.for_tenant("other").unwrap();
        assert_ne!(other.key, acme.key);
        assert_ne!(acme.key, client.key);
        let (a, b) = ([1u8; 16], [2u8; 16]);
        assert!(!other.verify(false, &a, &b, &acme.client_proof(&a, &b)));
        assert!(!client.verify(false, &a, &b, &acme.client_proof(&a, &b)));
        assert!(Credentials::parse(&format!("kvpool-store@acme:{}", "0".repeat(64))).is_err());
        assert!(Credentials::parse(&format!("kvpool-client@a b:{}", "0".repeat(64))).is_err());
        assert_eq!(format!("{acme:?}"), "Credentials(client@acme)");
    }

    #[test]
    fn bad_secrets_are_refused() {
        assert!(Credentials::parse("short").is_err());
        assert!(Credentials::parse("kvpool-root:00").is_err());
        assert!(Credentials::parse("kvpool-store:zz").is_err());
        assert!(Credentials::parse(&format!("kvpool-store:{}", "0".repeat(63))).is_err());
        // The Debug form never shows the key.
        assert_eq!(format!("{:?}", admin()), "Credentials(admin)");
    }

    #[test]
    fn proofs_bind_key_role_nonces_and_side() {
        let (a, b) = ([1u8; 16], [2u8; 16]);
        let store = admin().derive(Role::Store).unwrap();
        let p = store.client_proof(&a, &b);
        assert!(store.verify(false, &a, &b, &p));
        assert!(
            !store.verify(true, &a, &b, &p),
            "a client proof is no server proof"
        );
        assert!(!store.verify(false, &b, &a, &p), "nonces are ordered");
        assert!(!store.verify(false, &a, &[3; 16], &p));
        let other = Credentials::parse("another cluster's secret")
            .unwrap()
            .derive(Role::Store)
            .unwrap();
        assert!(!other.verify(false, &a, &b, &p));
        let client = store.derive(Role::Client).unwrap();
        assert!(
            !client.verify(false, &a, &b, &p),
            "a store proof is no client proof"
        );
    }
}
