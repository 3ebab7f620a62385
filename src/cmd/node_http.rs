//! A small JSON-over-HTTP client for the operator endpoints of a
//! coordinator node (`/v1/status`, `/v1/admin/…`) and of a proxy's admin
//! API, used by `fencer top` and `fencer log-level`.

use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Method, Request};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

/// Largest answer read, in bytes.
const MAX_RESPONSE_BYTES: usize = 4 << 20;

/// Calls `METHOD http://addr/path` with an optional JSON body and returns
/// the JSON answer; a non-2xx answer is an error carrying the server's
/// message (`error.message` of the coordinator, `detail` of the proxy).
pub(crate) async fn call(
    method: Method,
    addr: &str,
    path: &str,
    body: Option<&Value>,
    timeout: Duration,
) -> anyhow::Result<Value> {
    call_with(&HttpAuth::default(), method, addr, path, body, timeout).await
}

/// TLS and credentials for [`call_with`]: the same `--ca`, `--cert`,
/// `--key` and bearer token as the gRPC client commands.
#[derive(Clone, Default)]
pub(crate) struct HttpAuth {
    pub(crate) tls: Option<rustls::ClientConfig>,
    pub(crate) bearer: Option<String>,
}

/// [`call`] with TLS (`https://addr`) and a bearer token, when given.
pub(crate) async fn call_with(
    auth: &HttpAuth,
    method: Method,
    addr: &str,
    path: &str,
    body: Option<&Value>,
    timeout: Duration,
) -> anyhow::Result<Value> {
    let host = addr.trim_start_matches("http://").trim_start_matches("https://").trim_end_matches('/');
    let base = format!("{}://{host}", if auth.tls.is_some() { "https" } else { "http" });
    let connector = match &auth.tls {
        Some(config) => {
            HttpsConnectorBuilder::new().with_tls_config(config.clone()).https_only().enable_http1().build()
        }
        // Never used for TLS: the builder needs a config, http_only never starts one.
        None => HttpsConnectorBuilder::new()
            .with_tls_config(
                rustls::ClientConfig::builder_with_provider(fencer_tls::provider())
                    .with_safe_default_protocol_versions()?
                    .with_root_certificates(rustls::RootCertStore::empty())
                    .with_no_client_auth(),
            )
            .https_or_http()
            .enable_http1()
            .build(),
    };
    let client: Client<HttpsConnector<HttpConnector>, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build(connector);
    let mut req = Request::builder().method(method.clone()).uri(format!("{base}{path}"));
    if body.is_some() {
        req = req.header(hyper::header::CONTENT_TYPE, "application/json");
    }
    if let Some(token) = &auth.bearer {
        req = req.header(hyper::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let bytes = body.map(serde_json::to_vec).transpose()?.unwrap_or_default();
    let req = req.body(Full::new(Bytes::from(bytes))).with_context(|| format!("bad address {addr:?}"))?;
    let work = async {
        let resp = client.request(req).await?;
        let status = resp.status();
        let body =
            Limited::new(resp.into_body(), MAX_RESPONSE_BYTES).collect().await.map_err(|e| anyhow::anyhow!(e))?;
        Ok::<_, anyhow::Error>((status, body.to_bytes()))
    };
    let (status, bytes) = tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| anyhow::anyhow!("{base} did not answer {method} {path} within {timeout:?}"))?
        .with_context(|| format!("cannot reach {base}"))?;
    let value: Option<Value> = serde_json::from_slice(&bytes).ok();
    if !status.is_success() {
        let message = value
            .as_ref()
            .and_then(|v| v["error"]["message"].as_str().or_else(|| v["detail"].as_str()).map(str::to_string))
            .unwrap_or_else(|| String::from_utf8_lossy(&bytes).trim().to_string());
        anyhow::bail!("{base}{path} answered {status}: {message}");
    }
    value.with_context(|| format!("{base}{path} did not answer JSON"))
}
