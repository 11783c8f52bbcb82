//! TLS for `rediss://` nodes and storage (feature `tls`): rustls with the
//! `ring` provider, so no system OpenSSL is needed.
//!
//! Without settings, a `rediss://` URL trusts the system's root
//! certificates (read through `rustls-native-certs`). [`Tls`] replaces
//! them with a private CA, and adds a client certificate for servers that
//! require one (`tls-auth-clients yes`: mutual TLS). The server's
//! certificate must name the host of the URL (or its IP address).

use std::path::Path;
use std::sync::Arc;

use crate::error::{Error, Result};

/// TLS settings for `rediss://` URLs (feature `tls`); see
/// [`LockManagerBuilder::tls`](crate::LockManagerBuilder::tls) and
/// [`FencedRedis::with_tls`](crate::FencedRedis::with_tls).
///
/// ```no_run
/// # fn demo() -> quorumlock::Result<()> {
/// use quorumlock::{LockManager, Tls};
///
/// let tls = Tls::new()
///     .ca_file("/etc/redis/ca.pem")?
///     .client_cert_file("/etc/redis/client.pem")?
///     .client_key_file("/etc/redis/client.key")?;
/// let manager = LockManager::builder()
///     .nodes(["rediss://redis-1:6380", "rediss://redis-2:6380", "rediss://redis-3:6380"])
///     .tls(tls)
///     .build()?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Default)]
pub struct Tls {
    ca: Option<Vec<u8>>,
    client_cert: Option<Vec<u8>>,
    client_key: Option<Vec<u8>>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("Tls")
            .field("private_ca", &self.ca.is_some())
            .field("client_cert", &self.client_cert.is_some())
            .field("client_key", &self.client_key.is_some())
            .finish()
    }
}

fn read(argument: &'static str, path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| Error::InvalidArgument {
        argument,
        reason: format!("cannot read {}: {e}", path.display()),
    })
}

impl Tls {
    /// The system's root certificates, no client certificate.
    ///
    /// ```
    /// use quorumlock::Tls;
    ///
    /// // Managed Redis with a publicly trusted certificate: the system's roots.
    /// let tls = Tls::new();
    /// # let _ = tls;
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// Trust this CA (PEM) instead of the system's roots.
    ///
    /// ```
    /// # let certificates = quorumlock::testkit::TestCertificates::generate()?;
    /// # let ca_pem = certificates.ca_pem().to_owned();
    /// let tls = quorumlock::Tls::new().ca_pem(ca_pem);
    /// # let _ = tls;
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca = Some(pem.into());
        self
    }

    /// As [`ca_pem`](Self::ca_pem), from a file.
    ///
    /// ```
    /// # let certificates = quorumlock::testkit::TestCertificates::generate()?;
    /// # let dir = certificates.dir();
    /// # std::fs::write(dir.join("client.pem"), certificates.client_cert_pem()).expect("writable");
    /// # std::fs::write(dir.join("client.key"), certificates.client_key_pem()).expect("writable");
    /// let tls = quorumlock::Tls::new().ca_file(dir.join("ca.pem"))?;
    /// # let _ = tls;
    /// assert!(quorumlock::Tls::new().ca_file("/no/such/ca.pem").is_err());
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn ca_file(self, path: impl AsRef<Path>) -> Result<Self> {
        Ok(self.ca_pem(read("ca_file", path.as_ref())?))
    }

    /// The client certificate (PEM) that servers which ask for one
    /// (`tls-auth-clients yes`, mutual TLS) get; its key is
    /// [`client_key_pem`](Self::client_key_pem), and one without the other
    /// is refused when the manager (or storage) is built.
    ///
    /// ```
    /// # let certificates = quorumlock::testkit::TestCertificates::generate()?;
    /// let tls = quorumlock::Tls::new()
    ///     .ca_pem(certificates.ca_pem())
    ///     .client_cert_pem(certificates.client_cert_pem())
    ///     .client_key_pem(certificates.client_key_pem());
    /// # let _ = tls;
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn client_cert_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.client_cert = Some(pem.into());
        self
    }

    /// The private key (PEM) of the [client certificate](Self::client_cert_pem).
    pub fn client_key_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.client_key = Some(pem.into());
        self
    }

    /// As [`client_cert_pem`](Self::client_cert_pem), from a file.
    ///
    /// ```
    /// # let certificates = quorumlock::testkit::TestCertificates::generate()?;
    /// # let dir = certificates.dir();
    /// # std::fs::write(dir.join("client.pem"), certificates.client_cert_pem()).expect("writable");
    /// # std::fs::write(dir.join("client.key"), certificates.client_key_pem()).expect("writable");
    /// let tls = quorumlock::Tls::new()
    ///     .ca_file(dir.join("ca.pem"))?
    ///     .client_cert_file(dir.join("client.pem"))?
    ///     .client_key_file(dir.join("client.key"))?;
    /// # let _ = tls;
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn client_cert_file(self, path: impl AsRef<Path>) -> Result<Self> {
        Ok(self.client_cert_pem(read("client_cert_file", path.as_ref())?))
    }

    /// As [`client_key_pem`](Self::client_key_pem), from a file.
    pub fn client_key_file(self, path: impl AsRef<Path>) -> Result<Self> {
        Ok(self.client_key_pem(read("client_key_file", path.as_ref())?))
    }

    /// Whether the settings make sense together: a client certificate and
    /// its key come as a pair.
    pub(crate) fn check(&self) -> std::result::Result<(), String> {
        match (&self.client_cert, &self.client_key) {
            (Some(_), None) => Err(
                "a client certificate without its key: add `client_key_pem` \
                                    (or `client_key_file`), or drop the certificate"
                    .into(),
            ),
            (None, Some(_)) => Err(
                "a client key without its certificate: add `client_cert_pem` \
                                    (or `client_cert_file`), or drop the key"
                    .into(),
            ),
            _ => Ok(()),
        }
    }

    /// The rustls settings of the hot-path wire (`hot_wire.rs`): the same
    /// roots and client certificate as the redis-rs client gets.
    pub(crate) fn secured(&self) -> std::result::Result<Secured, String> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};

        self.check()?;
        let mut roots = rustls::RootCertStore::empty();
        match &self.ca {
            Some(pem) => {
                for certificate in CertificateDer::pem_slice_iter(pem) {
                    let certificate = certificate.map_err(|e| format!("the CA is not PEM: {e}"))?;
                    roots
                        .add(certificate)
                        .map_err(|e| format!("the CA certificate is unusable: {e}"))?;
                }
            }
            None => {
                // As redis-rs does: every system root that parses.
                let found = rustls_native_certs::load_native_certs();
                roots.add_parsable_certificates(found.certs);
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_root_certificates(roots);
        let config = match (&self.client_cert, &self.client_key) {
            (Some(cert), Some(key)) => {
                let chain = CertificateDer::pem_slice_iter(cert)
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(|e| format!("the client certificate is not PEM: {e}"))?;
                let key = PrivateKeyDer::from_pem_slice(key)
                    .map_err(|e| format!("the client key is not PEM: {e}"))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| format!("the client certificate is unusable: {e}"))?
            }
            _ => builder.with_no_client_auth(),
        };
        Ok(Secured(Arc::new(config)))
    }

    /// A client for `url` with these settings (a `rediss://` URL; others
    /// ignore them).
    pub(crate) fn client(&self, url: &str) -> std::result::Result<redis::Client, String> {
        self.check()?;
        let certificates = redis::TlsCertificates {
            client_tls: match (&self.client_cert, &self.client_key) {
                (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
                _ => None,
            },
            root_cert: self.ca.clone(),
        };
        redis::Client::build_with_tls(url, certificates).map_err(|e| {
            format!(
                "cannot use `{}` with these TLS settings: {e}",
                crate::address::without_password(url)
            )
        })
    }
}

/// TLS settings made ready for the hot-path wire's connections.
#[derive(Clone)]
pub(crate) struct Secured(Arc<rustls::ClientConfig>);

impl std::fmt::Debug for Secured {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not the roots and keys.
        f.write_str("Secured")
    }
}

impl Secured {
    /// TLS over `stream`, checking that the server's certificate names
    /// `host`.
    pub(crate) async fn connect(
        &self,
        host: &str,
        stream: tokio::net::TcpStream,
    ) -> std::result::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, String> {
        let name = rustls::pki_types::ServerName::try_from(host.to_owned())
            .map_err(|e| format!("`{host}` cannot be checked against a certificate: {e}"))?;
        tokio_rustls::TlsConnector::from(Arc::clone(&self.0))
            .connect(name, stream)
            .await
            .map_err(|e| format!("TLS handshake: {e}"))
    }
}
