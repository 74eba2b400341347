//! TLS for the RPC, data and HTTP planes and for etcd (rustls with the
//! `ring` provider: no OpenSSL, no cmake).
//!
//! A process's TLS material is three PEM files: its certificate chain, its
//! private key, and the CA bundle it verifies peers against. TLS is all or
//! nothing per cluster: a process that has a CA speaks TLS to every kvpool
//! peer, and a server with a certificate accepts TLS only (a plaintext peer
//! is told so in a plaintext error frame, then disconnected).
//!
//! Client certificates are verified whenever a peer presents one. A peer
//! without one proves at most the client role, whatever key it holds:
//! stores, the master and operators present certificates (mutual TLS for
//! every role that can change the pool's shape), engines may go without.
//! `require_client_cert` turns away every peer without one.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kvpool_proto::{Code, KvError, KvResult};
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::{client, server, TlsConnector};

use kvpool_proto::Role;

/// rustls's client configuration, for crates that pass one along.
pub use rustls::ClientConfig as TlsClientConfig;
/// The server side of TLS, for servers other than the framed ones (HTTP).
pub use tokio_rustls::TlsAcceptor;

/// Environment variable naming this process's certificate chain (PEM).
pub const CERT_ENV: &str = "KVPOOL_TLS_CERT";
/// Environment variable naming this process's private key (PEM).
pub const KEY_ENV: &str = "KVPOOL_TLS_KEY";
/// Environment variable naming the CA bundle peers are verified against.
pub const CA_ENV: &str = "KVPOOL_TLS_CA";
/// Environment variable that makes servers turn away peers without a
/// client certificate.
pub const REQUIRE_CLIENT_CERT_ENV: &str = "KVPOOL_TLS_REQUIRE_CLIENT_CERT";
/// Environment variables of the TLS material for `https://` etcd
/// endpoints (CA, certificate, key); each falls back to kvpool's own.
pub const ETCD_ENV: [&str; 3] = ["KVPOOL_ETCD_CA", "KVPOOL_ETCD_CERT", "KVPOOL_ETCD_KEY"];

/// The first byte of every TLS connection (a handshake record).
pub const TLS_HANDSHAKE_BYTE: u8 = 0x16;

/// Where a process's TLS material lives, as given by flags or environment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// Certificate chain presented to peers (PEM), leaf first.
    pub cert: Option<PathBuf>,
    /// Private key of the leaf certificate (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: Option<PathBuf>,
    /// CA certificates peers' certificates must chain to (PEM).
    pub ca: Option<PathBuf>,
    /// Servers turn away peers that present no certificate.
    pub require_client_cert: bool,
}

fn env_path(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// A yes/no word as users write it in flags and env vars (any case,
/// trimmed); `None` for anything else.
pub fn yes_no(s: &str) -> Option<bool> {
    match s.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// Whether the env var `name` says yes.
pub(crate) fn env_flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| yes_no(&v) == Some(true))
}

impl TlsFiles {
    /// The files named by `KVPOOL_TLS_CERT`, `KVPOOL_TLS_KEY`,
    /// `KVPOOL_TLS_CA` and `KVPOOL_TLS_REQUIRE_CLIENT_CERT`.
    pub fn from_env() -> TlsFiles {
        TlsFiles {
            cert: env_path(CERT_ENV),
            key: env_path(KEY_ENV),
            ca: env_path(CA_ENV),
            require_client_cert: env_flag(REQUIRE_CLIENT_CERT_ENV),
        }
    }

    /// The files for `https://` etcd endpoints: `KVPOOL_ETCD_*`, each
    /// falling back to this process's kvpool TLS file.
    pub fn etcd_from_env(&self) -> TlsFiles {
        let [ca, cert, key] = ETCD_ENV.map(env_path);
        TlsFiles {
            cert: cert.or_else(|| self.cert.clone()),
            key: key.or_else(|| self.key.clone()),
            ca: ca.or_else(|| self.ca.clone()),
            require_client_cert: false,
        }
    }

    /// Whether any TLS file is named (TLS is on).
    pub fn is_set(&self) -> bool {
        self.cert.is_some() || self.key.is_some() || self.ca.is_some()
    }

    /// Loads and checks the files; `None` when none is named. Every
    /// problem is an error naming the file and what is wrong with it.
    pub fn load(&self) -> KvResult<Option<Tls>> {
        if !self.is_set() {
            if self.require_client_cert {
                return Err(tls_error(
                    "requiring client certificates needs TLS: set --tls-ca, --tls-cert and --tls-key"
                        .to_string(),
                ));
            }
            return Ok(None);
        }
        let ca = self.ca.as_deref().ok_or_else(|| {
            tls_error(format!(
                "TLS needs a CA bundle to verify peers against: set --tls-ca ({CA_ENV})"
            ))
        })?;
        let roots = load_roots(ca)?;
        let identity = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => Some((load_certs(cert)?, load_key(key)?)),
            (None, None) => None,
            _ => {
                return Err(tls_error(
                    "--tls-cert and --tls-key go together: give both or neither".to_string(),
                ))
            }
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let client = client_config(
            &provider,
            roots.clone(),
            identity.as_ref().map(|(c, k)| (c.clone(), k.clone_key())),
        )?;
        let acceptor = match &identity {
            None => None,
            Some((chain, key)) => {
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(roots.into(), provider.clone());
                let verifier = if self.require_client_cert {
                    verifier.build()
                } else {
                    verifier.allow_unauthenticated().build()
                }
                .map_err(|e| tls_error(format!("CA bundle {}: {e}", ca.display())))?;
                let config = ServerConfig::builder_with_provider(provider.clone())
                    .with_safe_default_protocol_versions()
                    .map_err(|e| tls_error(e.to_string()))?
                    .with_client_cert_verifier(verifier)
                    .with_single_cert(chain.clone(), key.clone_key())
                    .map_err(|e| {
                        tls_error(format!(
                            "certificate {} and key {}: {e}",
                            path_of(&self.cert),
                            path_of(&self.key)
                        ))
                    })?;
                Some(TlsAcceptor::from(Arc::new(config)))
            }
        };
        Ok(Some(Tls {
            client: Arc::new(client),
            acceptor,
            has_cert: identity.is_some(),
            require_client_cert: self.require_client_cert,
        }))
    }
}

fn path_of(p: &Option<PathBuf>) -> String {
    p.as_deref()
        .map_or_else(|| "-".to_string(), |p| p.display().to_string())
}

/// A process's loaded TLS configuration: how it connects, and how it
/// serves when it has a certificate.
#[derive(Clone)]
pub struct Tls {
    client: Arc<ClientConfig>,
    acceptor: Option<TlsAcceptor>,
    has_cert: bool,
    require_client_cert: bool,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field("serves", &self.acceptor.is_some())
            .field("has_cert", &self.has_cert)
            .field("require_client_cert", &self.require_client_cert)
            .finish()
    }
}

/// A TLS stream a server accepted, and the most its peer may prove.
pub struct Accepted {
    /// The stream.
    pub stream: server::TlsStream<TcpStream>,
    /// The highest role the peer may prove: every role with a verified
    /// client certificate, the client role without one.
    pub ceiling: Role,
}

impl Tls {
    /// Whether this process has a certificate, so it can serve (and
    /// proves roles above client when it connects).
    pub fn has_cert(&self) -> bool {
        self.has_cert
    }

    /// Whether this process, serving, turns away peers without a
    /// certificate.
    pub fn requires_client_cert(&self) -> bool {
        self.require_client_cert
    }

    /// The client configuration (also used for `https://` etcd).
    pub fn client_config(&self) -> Arc<ClientConfig> {
        self.client.clone()
    }

    /// Opens TLS over `tcp` to `addr` (`host:port`), verifying that the
    /// server's certificate names `host` and chains to the CA.
    pub async fn connect(
        &self,
        addr: &str,
        tcp: TcpStream,
    ) -> KvResult<client::TlsStream<TcpStream>> {
        let name = server_name(addr)?;
        TlsConnector::from(self.client.clone())
            .connect(name, tcp)
            .await
            .map_err(|e| {
                KvError::new(
                    Code::Unauthorized,
                    format!(
                        "TLS handshake with {addr} failed: {e} (does it serve TLS with a \
                         certificate for this address from the same CA?)"
                    ),
                )
            })
    }

    /// Completes a server-side TLS handshake over `tcp`. Errors when this
    /// process has no certificate.
    pub async fn accept(&self, tcp: TcpStream) -> KvResult<Accepted> {
        let acceptor = self
            .acceptor
            .as_ref()
            .ok_or_else(|| tls_error("serving TLS needs --tls-cert and --tls-key".to_string()))?;
        let stream = acceptor
            .accept(tcp)
            .await
            .map_err(|e| KvError::new(Code::Unauthorized, format!("TLS handshake failed: {e}")))?;
        // rustls reports peer certificates only once they verified.
        let verified = stream.get_ref().1.peer_certificates().is_some();
        Ok(Accepted {
            stream,
            ceiling: if verified { Role::Admin } else { Role::Client },
        })
    }

    /// The acceptor for other servers (HTTP), if this process can serve.
    pub fn acceptor(&self) -> Option<&TlsAcceptor> {
        self.acceptor.as_ref()
    }
}

/// The server name to verify for `addr` (`host:port`, `[v6]:port`).
fn server_name(addr: &str) -> KvResult<ServerName<'static>> {
    let host = match addr.rsplit_once(':') {
        Some((h, p)) if p.parse::<u16>().is_ok() => h,
        _ => addr,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(host.to_string())
        .map_err(|e| tls_error(format!("{addr}: not a host name for TLS: {e}")))
}

fn client_config(
    provider: &Arc<CryptoProvider>,
    roots: RootCertStore,
    identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
) -> KvResult<ClientConfig> {
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_error(e.to_string()))?
        .with_root_certificates(roots);
    match identity {
        Some((chain, key)) => builder
            .with_client_auth_cert(chain, key)
            .map_err(|e| tls_error(format!("client certificate: {e}"))),
        None => Ok(builder.with_no_client_auth()),
    }
}

fn load_certs(path: &Path) -> KvResult<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| tls_error(format!("certificate file {}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(tls_error(format!(
            "certificate file {} holds no PEM certificate",
            path.display()
        )));
    }
    Ok(certs)
}

fn load_key(path: &Path) -> KvResult<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path)
        .map_err(|e| tls_error(format!("private key file {}: {e}", path.display())))
}

fn load_roots(path: &Path) -> KvResult<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(path)? {
        roots
            .add(cert)
            .map_err(|e| tls_error(format!("CA bundle {}: {e}", path.display())))?;
    }
    Ok(roots)
}

fn tls_error(msg: String) -> KvError {
    KvError::new(Code::InvalidParams, msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_names_come_from_addresses() {
        assert!(matches!(
            server_name("127.0.0.1:50051").unwrap(),
            ServerName::IpAddress(_)
        ));
        assert!(matches!(
            server_name("[::1]:50051").unwrap(),
            ServerName::IpAddress(_)
        ));
        assert!(matches!(
            server_name("store-0.kvpool:7000").unwrap(),
            ServerName::DnsName(_)
        ));
        assert!(server_name("bad host:1").is_err());
    }

    #[test]
    fn incomplete_settings_are_refused_by_name() {
        let no_ca = TlsFiles {
            cert: Some("c.pem".into()),
            key: Some("k.pem".into()),
            ..TlsFiles::default()
        };
        assert!(no_ca.load().unwrap_err().message.contains("--tls-ca"));
        let half = TlsFiles {
            ca: Some("/nonexistent/ca.pem".into()),
            ..TlsFiles::default()
        };
        let e = half.load().unwrap_err().message;
        assert!(e.contains("/nonexistent/ca.pem"), "{e}");
        let require = TlsFiles {
            require_client_cert: true,
            ..TlsFiles::default()
        };
        assert!(require.load().is_err());
        assert!(TlsFiles::default().load().unwrap().is_none());
    }
}
