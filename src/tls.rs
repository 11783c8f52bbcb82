//! TLS for `rediss://` nodes and storage (feature `tls`): rustls with the
//! `ring` provider, so no system OpenSSL is needed.
//!
//! Without settings, a `rediss://` URL trusts the system's root
//! certificates (read through `rustls-native-certs`). [`Tls`] replaces
//! them with a private CA, and adds a client certificate for servers that
//! require one (`tls-auth-clients yes`: mutual TLS). The server's
//! certificate must name the host of the URL (or its IP address).

use std::path::Path;

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
///     .client_identity_files("/etc/redis/client.pem", "/etc/redis/client.key")?;
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
    identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("Tls")
            .field("private_ca", &self.ca.is_some())
            .field("client_identity", &self.identity.is_some())
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

    /// Present this client certificate and key (PEM) to servers that ask
    /// for one (mutual TLS).
    ///
    /// ```
    /// # let certificates = quorumlock::testkit::TestCertificates::generate()?;
    /// let tls = quorumlock::Tls::new()
    ///     .ca_pem(certificates.ca_pem())
    ///     .client_identity(certificates.client_cert_pem(), certificates.client_key_pem());
    /// # let _ = tls;
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn client_identity(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.identity = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// As [`client_identity`](Self::client_identity), from files.
    ///
    /// ```
    /// # let certificates = quorumlock::testkit::TestCertificates::generate()?;
    /// # let dir = certificates.dir();
    /// # std::fs::write(dir.join("client.pem"), certificates.client_cert_pem()).expect("writable");
    /// # std::fs::write(dir.join("client.key"), certificates.client_key_pem()).expect("writable");
    /// let tls = quorumlock::Tls::new()
    ///     .ca_file(dir.join("ca.pem"))?
    ///     .client_identity_files(dir.join("client.pem"), dir.join("client.key"))?;
    /// # let _ = tls;
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn client_identity_files(
        self,
        cert: impl AsRef<Path>,
        key: impl AsRef<Path>,
    ) -> Result<Self> {
        let cert = read("client_identity_files", cert.as_ref())?;
        let key = read("client_identity_files", key.as_ref())?;
        Ok(self.client_identity(cert, key))
    }

    /// A client for `url` with these settings (a `rediss://` URL; others
    /// ignore them).
    pub(crate) fn client(&self, url: &str) -> Result<redis::Client, String> {
        let certificates = redis::TlsCertificates {
            client_tls: self
                .identity
                .as_ref()
                .map(|(cert, key)| redis::ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
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
