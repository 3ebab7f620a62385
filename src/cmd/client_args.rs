//! The flags every client command takes (`--endpoints`, `-o`, TLS, a
//! tenant's bearer token), and the clients built from them: the gRPC
//! [`Client`] and, for the JSON endpoints, [`HttpAuth`]. Certificates and
//! keys are read with `fencer-tls`, as the coordinator and the proxy read
//! theirs.

use fencer_client::Client;

use super::node_http::HttpAuth;
use crate::output::OutputFormat;

/// Flags every client command takes.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ClientArgs {
    /// Coordinator endpoints, `host:port[,host:port…]`; any node will do.
    #[arg(long, env = "FENCER_ENDPOINTS", value_delimiter = ',', default_value = fencer_client::DEFAULT_ENDPOINT, global = true)]
    pub(crate) endpoints: Vec<String>,

    /// Output format.
    #[arg(short = 'o', long = "output", env = "FENCER_OUTPUT", value_enum, default_value_t = OutputFormat::Table, global = true)]
    pub(crate) output: OutputFormat,

    /// Speak TLS to the coordinators and verify their certificates against
    /// this CA (PEM). Endpoints become https.
    #[arg(long, env = "FENCER_CA", global = true)]
    pub(crate) ca: Option<std::path::PathBuf>,

    /// Client certificate (PEM) for mTLS; needs --ca and --key.
    #[arg(long, env = "FENCER_CERT", global = true, requires = "ca")]
    pub(crate) cert: Option<std::path::PathBuf>,

    /// The client certificate's private key (PEM).
    #[arg(long, env = "FENCER_KEY", global = true, requires = "cert")]
    pub(crate) key: Option<std::path::PathBuf>,

    /// Verify the coordinators' certificates for this name instead of each
    /// endpoint's host.
    #[arg(long, env = "FENCER_TLS_SERVER_NAME", global = true, requires = "ca")]
    pub(crate) tls_server_name: Option<String>,

    /// A tenant's bearer token, sent with every call (prefer the env var or
    /// --bearer-token-file: command lines are visible to other users).
    #[arg(long, env = "FENCER_BEARER_TOKEN", hide_env_values = true, global = true)]
    pub(crate) bearer_token: Option<String>,

    /// Read the bearer token from this file (first line).
    #[arg(long, env = "FENCER_BEARER_TOKEN_FILE", global = true, conflicts_with = "bearer_token")]
    pub(crate) bearer_token_file: Option<std::path::PathBuf>,
}

impl ClientArgs {
    /// TLS and the bearer token for the JSON endpoints (`fencer top`): the
    /// same files as the gRPC client, read with `fencer-tls` (bounded, and
    /// every error names its file).
    pub(crate) fn http_auth(&self) -> anyhow::Result<HttpAuth> {
        let tls = match &self.ca {
            None => None,
            Some(ca) => {
                let builder = rustls::ClientConfig::builder_with_provider(fencer_tls::provider())
                    .with_safe_default_protocol_versions()?
                    .with_root_certificates(fencer_tls::load_roots(ca)?);
                Some(match (&self.cert, &self.key) {
                    (Some(cert), Some(key)) => builder
                        .with_client_auth_cert(fencer_tls::load_certs(cert)?, fencer_tls::load_key(key)?)
                        .map_err(|e| anyhow::anyhow!("{}: {e}", cert.display()))?,
                    _ => builder.with_no_client_auth(),
                })
            }
        };
        Ok(HttpAuth { tls, bearer: self.bearer_token()? })
    }

    fn bearer_token(&self) -> anyhow::Result<Option<String>> {
        let token = match (&self.bearer_token, &self.bearer_token_file) {
            (Some(t), _) => Some(t.trim().to_string()),
            (None, Some(path)) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| anyhow::anyhow!("cannot read --bearer-token-file {}: {e}", path.display()))?;
                Some(text.lines().next().unwrap_or_default().trim().to_string())
            }
            (None, None) => None,
        };
        Ok(token.filter(|t| !t.is_empty()))
    }

    pub(crate) fn client(&self) -> anyhow::Result<Client> {
        let mut client = Client::new(self.endpoints.clone())?;
        if let Some(ca) = &self.ca {
            let mut tls = fencer_client::ClientTls::from_files(ca, self.cert.as_deref(), self.key.as_deref())?;
            tls.domain_name = self.tls_server_name.clone();
            client = client.with_tls(&tls)?;
        } else if self.cert.is_some() || self.key.is_some() {
            anyhow::bail!("--cert and --key need --ca");
        }
        if let Some(t) = self.bearer_token()? {
            client = client.with_bearer_token(&t)?;
        }
        Ok(client)
    }
}
