//! `kvpool tls new`: a private CA and certificates for a pool's hosts, for
//! trying TLS and for tests. Production deployments usually bring their
//! own PKI (cert-manager, Vault); kvpool only needs PEM files.
//!
//! Every certificate serves and authenticates as a client (both extended
//! key usages), because a store is both: it serves its segment and
//! connects to the master with a client certificate.

use std::path::Path;

use anyhow::Context;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

use crate::cli::write_private;

/// Days a generated certificate stays valid.
const VALID_DAYS: i64 = 825;

/// One certificate to issue: `NAME` or `NAME=SAN,SAN,...`.
#[derive(Debug, Clone)]
pub struct CertSpec {
    name: String,
    sans: Vec<String>,
}

impl std::fmt::Display for CertSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name, self.sans.join(", "))
    }
}

impl std::str::FromStr for CertSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (name, sans) = match s.split_once('=') {
            Some((n, sans)) => (
                n,
                sans.split(',').map(str::trim).map(String::from).collect(),
            ),
            None => (s, Vec::new()),
        };
        let name = name.trim();
        let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
        if name.is_empty() || !name.chars().all(ok) || name.starts_with('.') {
            return Err(format!(
                "{name:?}: a certificate name is letters, digits, '-', '_' and '.' (it names the files)"
            ));
        }
        let mut sans: Vec<String> = sans.into_iter().filter(|s| !s.is_empty()).collect();
        if sans.is_empty() {
            sans = vec!["127.0.0.1".into(), "::1".into(), "localhost".into()];
        }
        Ok(CertSpec {
            name: name.to_string(),
            sans,
        })
    }
}

/// Writes `ca.pem`, `ca.key` and `<name>.pem`, `<name>.key` for each of
/// `certs` into `out` (created if missing); keys are 0600 and no file is
/// overwritten.
pub fn new_pki(out: &Path, certs: &[CertSpec]) -> anyhow::Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let now = time_now();
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "kvpool cluster CA");
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca_params.not_before = now;
    ca_params.not_after = now + time::Duration::days(VALID_DAYS);
    let ca_key = KeyPair::generate()?;
    let ca = ca_params.self_signed(&ca_key)?;
    write_public(&out.join("ca.pem"), &ca.pem())?;
    write_private(&out.join("ca.key"), &ca_key.serialize_pem())?;
    for spec in certs {
        let mut params = CertificateParams::new(spec.sans.clone())
            .with_context(|| format!("certificate {}: subject names {:?}", spec.name, spec.sans))?;
        params
            .distinguished_name
            .push(DnType::CommonName, spec.name.as_str());
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.not_before = now;
        params.not_after = now + time::Duration::days(VALID_DAYS);
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &ca, &ca_key)?;
        write_public(&out.join(format!("{}.pem", spec.name)), &cert.pem())?;
        write_private(
            &out.join(format!("{}.key", spec.name)),
            &key.serialize_pem(),
        )?;
    }
    Ok(())
}

/// Now, a day back, so hosts whose clocks lag a little accept the
/// certificates at once.
fn time_now() -> time::OffsetDateTime {
    time::OffsetDateTime::now_utc() - time::Duration::days(1)
}

fn write_public(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    f.write_all(text.as_bytes())?;
    Ok(())
}
