//! [`TestCertificates`]: a certificate authority made at test time, with a
//! server certificate for the loopback address and a client certificate,
//! both signed by it, written as PEM files for `redis-server`'s TLS port.
//! No key is ever checked in.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};
use tempfile::TempDir;

use crate::error::{Error, Result};

/// A CA and the certificates it signed, in PEM, with the files a TLS
/// `redis-server` reads (see [`ClusterOptions::tls`](super::ClusterOptions::tls)).
pub struct TestCertificates {
    ca: String,
    client_cert: String,
    client_key: String,
    dir: TempDir,
}

impl std::fmt::Debug for TestCertificates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCertificates")
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

fn failed(what: &str, error: impl std::fmt::Display) -> Error {
    Error::Testkit(format!("cannot make test certificates ({what}): {error}"))
}

/// A certificate for `names` (and 127.0.0.1) for `purpose`, signed by the CA.
fn signed(
    names: &[&str],
    purpose: ExtendedKeyUsagePurpose,
    ca: &Certificate,
    ca_key: &KeyPair,
) -> Result<(String, String)> {
    let key = KeyPair::generate().map_err(|e| failed("key", e))?;
    let mut params =
        CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .map_err(|e| failed("names", e))?;
    params
        .subject_alt_names
        .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
    params.distinguished_name.push(
        DnType::CommonName,
        names.first().copied().unwrap_or("quorumlock"),
    );
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![purpose];
    let cert = params
        .signed_by(&key, ca, ca_key)
        .map_err(|e| failed("signing", e))?;
    Ok((cert.pem(), key.serialize_pem()))
}

impl TestCertificates {
    /// Makes a new CA, a server certificate for `localhost` and
    /// `127.0.0.1`, and a client certificate, in a temporary directory.
    pub fn generate() -> Result<Self> {
        let ca_key = KeyPair::generate().map_err(|e| failed("CA key", e))?;
        let mut params =
            CertificateParams::new(Vec::<String>::new()).map_err(|e| failed("CA", e))?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "quorumlock test CA");
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = params.self_signed(&ca_key).map_err(|e| failed("CA", e))?;
        let (server_cert, server_key) = signed(
            &["localhost"],
            ExtendedKeyUsagePurpose::ServerAuth,
            &ca,
            &ca_key,
        )?;
        let (client_cert, client_key) = signed(
            &["quorumlock-client"],
            ExtendedKeyUsagePurpose::ClientAuth,
            &ca,
            &ca_key,
        )?;
        let dir = tempfile::Builder::new()
            .prefix("quorumlock-certs-")
            .tempdir()
            .map_err(|e| failed("directory", e))?;
        let write = |name: &str, pem: &str| {
            std::fs::write(dir.path().join(name), pem).map_err(|e| failed(name, e))
        };
        write("ca.pem", &ca.pem())?;
        write("server.pem", &server_cert)?;
        write("server.key", &server_key)?;
        Ok(Self {
            ca: ca.pem(),
            client_cert,
            client_key,
            dir,
        })
    }

    /// The CA certificate, PEM: what clients trust.
    pub fn ca_pem(&self) -> &str {
        &self.ca
    }

    /// The client certificate, PEM, for mutual TLS.
    pub fn client_cert_pem(&self) -> &str {
        &self.client_cert
    }

    /// The client certificate's private key, PEM.
    pub fn client_key_pem(&self) -> &str {
        &self.client_key
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The `redis-server` arguments for a TLS port (the caller adds
    /// `--tls-port`) with these certificates; `require_client_cert`: mutual
    /// TLS (`--tls-auth-clients yes`).
    pub(crate) fn server_args(&self, require_client_cert: bool) -> Vec<String> {
        let path = |name: &str| self.file(name).display().to_string();
        vec![
            "--tls-cert-file".into(),
            path("server.pem"),
            "--tls-key-file".into(),
            path("server.key"),
            "--tls-ca-cert-file".into(),
            path("ca.pem"),
            "--tls-auth-clients".into(),
            if require_client_cert { "yes" } else { "no" }.into(),
        ]
    }

    /// The directory holding the PEM files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}
