//! `fencer proxy`, `fencer rejections`, `fencer proxy-status`.

use std::process::ExitCode;

/// Arguments of `fencer proxy`.
#[derive(Debug, clap::Args)]
pub(crate) struct ProxyArgs {}

/// Arguments of `fencer rejections`.
#[derive(Debug, clap::Args)]
pub(crate) struct RejectionsArgs {}

/// Arguments of `fencer proxy-status`.
#[derive(Debug, clap::Args)]
pub(crate) struct ProxyStatusArgs {}

pub(crate) async fn run_proxy(_args: ProxyArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("the proxy is not built yet")
}

pub(crate) async fn run_rejections(_args: RejectionsArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("the proxy is not built yet")
}

pub(crate) async fn run_proxy_status(_args: ProxyStatusArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("the proxy is not built yet")
}
