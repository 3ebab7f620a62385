//! A small client for the admin API, used by `fencer rejections` and
//! `fencer proxy-status`.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode, Uri, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::core::admin::{
    AdminToken, ClearIndeterminateRequest, ClearIndeterminateResponse, RaiseEpochRequest, ResourcesPage,
};
use crate::core::rejections::RejectionsPage;
use crate::core::state::ResourceStatus;

/// The environment variable naming the file that holds the admin bearer
/// token, read by [`AdminClient::with_token_from_env`] (the token itself is
/// never on the command line or in the environment).
pub const ADMIN_TOKEN_FILE_ENV: &str = "FENCER_PROXY_ADMIN_TOKEN_FILE";

/// Largest admin response read, in bytes.
const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// Why an admin call failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminClientError {
    /// The address is not usable.
    #[error("admin address {0:?} is not host:port or http://host:port")]
    BadAddress(String),
    /// The proxy could not be reached or did not answer in time.
    #[error("cannot reach the proxy admin API at {addr}: {reason}")]
    Unreachable {
        /// The admin base URL.
        addr: String,
        /// What failed.
        reason: String,
    },
    /// The proxy answered with an error.
    #[error("the proxy answered {status}: {detail}")]
    Status {
        /// HTTP status.
        status: StatusCode,
        /// The problem detail, or the body.
        detail: String,
    },
    /// The answer could not be decoded.
    #[error("cannot decode the proxy's answer: {0}")]
    Decode(String),
    /// The admin token file is unusable.
    #[error(transparent)]
    Token(#[from] crate::core::admin::AdminTokenError),
}

/// Client for one proxy's admin API.
#[derive(Debug, Clone)]
pub struct AdminClient {
    base: String,
    client: Client<HttpConnector, Full<Bytes>>,
    timeout: Duration,
    token: Option<AdminToken>,
}

impl AdminClient {
    /// `addr` is `host:port` or `http://host:port`; every call times out
    /// after `timeout`.
    pub fn new(addr: &str, timeout: Duration) -> Result<Self, AdminClientError> {
        let base =
            if addr.starts_with("http://") { addr.trim_end_matches('/').to_owned() } else { format!("http://{addr}") };
        let uri: Uri = base.parse().map_err(|_| AdminClientError::BadAddress(addr.to_owned()))?;
        if uri.authority().is_none() || !matches!(uri.path(), "" | "/") {
            return Err(AdminClientError::BadAddress(addr.to_owned()));
        }
        let client = Client::builder(TokioExecutor::new()).build_http();
        Ok(Self { base, client, timeout, token: None })
    }

    /// Sends the bearer token read from `path` (as the proxy reads its
    /// `admin_token_file`) with every call.
    pub fn with_token_file(mut self, path: &std::path::Path) -> Result<Self, AdminClientError> {
        self.token = Some(AdminToken::load(path)?);
        Ok(self)
    }

    /// [`with_token_file`](Self::with_token_file) with the file named by
    /// [`ADMIN_TOKEN_FILE_ENV`], when it is set.
    pub fn with_token_from_env(self) -> Result<Self, AdminClientError> {
        match std::env::var_os(ADMIN_TOKEN_FILE_ENV) {
            Some(path) if !path.is_empty() => self.with_token_file(std::path::Path::new(&path)),
            _ => Ok(self),
        }
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path_and_query: &str,
        body: Option<Vec<u8>>,
    ) -> Result<T, AdminClientError> {
        let unreachable = |reason: String| AdminClientError::Unreachable { addr: self.base.clone(), reason };
        let mut req = Request::builder().method(method).uri(format!("{}{path_and_query}", self.base));
        if body.is_some() {
            req = req.header(header::CONTENT_TYPE, "application/json");
        }
        if let Some(token) = &self.token {
            req = req.header(header::AUTHORIZATION, token.bearer());
        }
        let req = req
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| AdminClientError::BadAddress(e.to_string()))?;
        let work = async {
            let resp = self.client.request(req).await.map_err(|e| unreachable(e.to_string()))?;
            let status = resp.status();
            let bytes = Limited::new(resp.into_body(), MAX_RESPONSE_BYTES)
                .collect()
                .await
                .map_err(|e| unreachable(e.to_string()))?
                .to_bytes();
            Ok::<_, AdminClientError>((status, bytes))
        };
        let (status, bytes) = tokio::time::timeout(self.timeout, work)
            .await
            .map_err(|_| unreachable(format!("no answer within {:?}", self.timeout)))??;
        if !status.is_success() {
            let detail = serde_json::from_slice::<serde_json::Value>(&bytes)
                .ok()
                .and_then(|v| v.get("detail").and_then(|d| d.as_str()).map(str::to_owned))
                .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned());
            return Err(AdminClientError::Status { status, detail });
        }
        serde_json::from_slice(&bytes).map_err(|e| AdminClientError::Decode(e.to_string()))
    }

    fn encode(value: &impl Serialize) -> Vec<u8> {
        serde_json::to_vec(value).unwrap_or_default()
    }

    /// One resource's state (the floor's, if the proxy never saw it).
    pub async fn resource(&self, name: &str) -> Result<ResourceStatus, AdminClientError> {
        let page: ResourcesPage =
            self.call(Method::GET, &format!("/v1/resources?name={}", encode_query(name)), None).await?;
        page.resources.into_iter().next().ok_or_else(|| AdminClientError::Decode("empty answer".into()))
    }

    /// A page of resources in name order.
    pub async fn resources(&self, after: Option<&str>, limit: usize) -> Result<ResourcesPage, AdminClientError> {
        let mut q = format!("/v1/resources?limit={limit}");
        if let Some(a) = after {
            q.push_str(&format!("&after={}", encode_query(a)));
        }
        self.call(Method::GET, &q, None).await
    }

    /// A page of rejections, newest first, older than `before`.
    pub async fn rejections(&self, before: Option<u64>, limit: usize) -> Result<RejectionsPage, AdminClientError> {
        let mut q = format!("/v1/rejections?limit={limit}");
        if let Some(b) = before {
            q.push_str(&format!("&before={b}"));
        }
        self.call(Method::GET, &q, None).await
    }

    /// Raises a resource's epoch (audited; never lowers).
    pub async fn raise_epoch(&self, req: &RaiseEpochRequest) -> Result<ResourceStatus, AdminClientError> {
        self.call(Method::POST, "/v1/raise-epoch", Some(Self::encode(req))).await
    }

    /// Clears a resource's indeterminate marker (audited).
    pub async fn clear_indeterminate(
        &self,
        req: &ClearIndeterminateRequest,
    ) -> Result<ClearIndeterminateResponse, AdminClientError> {
        self.call(Method::POST, "/v1/clear-indeterminate", Some(Self::encode(req))).await
    }

    /// Re-reads the proxy's signing key-set file (audited); on failure the
    /// keys in force stay and the error says why.
    pub async fn reload_keys(&self) -> Result<crate::core::signing::KeysLoaded, AdminClientError> {
        self.call(Method::POST, "/v1/reload-keys", None).await
    }
}

fn encode_query(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}
