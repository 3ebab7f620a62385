//! An application that writes to a database through `fencer proxy`, with
//! every request stamped with its lease's fencing token by the client's
//! [`StampLayer`](fencer_client::StampLayer).
//!
//! ```text
//! fencer dev &                                           # coordinator on 127.0.0.1:7420
//! influxd &                                              # or any HTTP service, on 127.0.0.1:8086
//! fencer proxy --listen 127.0.0.1:8087 --upstream http://127.0.0.1:8086 \
//!              --resource metrics/cpu --data-dir ./proxy-data \
//!              --floor "$(fencer status -o json | jq .commit_index)" &
//! cargo run --example proxy_writer -- http://127.0.0.1:8087 metrics/cpu '/write?db=example' 'cpu,host=a value=1'
//! ```
//! Run it twice: the second copy waits for the lock. Pause the first
//! (`kill -STOP`) past its ttl and resume it (`kill -CONT`): its layer
//! refuses to send (its lease is Lost), and a write that was already on its
//! way would get `409` from the proxy, because the second copy's larger
//! token has reached the proxy since.

use std::time::Duration;

use bytes::Bytes;
use fencer_client::{Client, PlainToken, StampedError};
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::rt::TokioExecutor;
use tower::{Service, ServiceBuilder, ServiceExt};

const TTL: Duration = Duration::from_secs(10);

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let proxy = args.next().unwrap_or_else(|| "http://127.0.0.1:8087".into());
    let resource = args.next().unwrap_or_else(|| "metrics/cpu".into());
    let path = args.next().unwrap_or_else(|| "/write?db=example".into());
    let line = args.next().unwrap_or_else(|| "cpu,host=a value=1".into());
    let endpoints = std::env::var("FENCER_ENDPOINTS").unwrap_or_else(|_| fencer_client::DEFAULT_ENDPOINT.into());

    let client = Client::new(endpoints.split(','))?;
    eprintln!("waiting for the lock on {resource} …");
    let lease = client.acquire(resource.as_str()).ttl(TTL).wait(Duration::from_secs(120)).await?;
    eprintln!("holding {resource} with fencing token {}", lease.token());

    // The stamping layer sits directly on the HTTP client: every request
    // that leaves carries Fencing-Token (and Fencing-Resource, which the
    // proxy checks against its route), and none leaves unless Held.
    let http = HttpClient::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let stamp = lease.stamp_layer().with_stamp(PlainToken::default().with_resource());
    let mut writer = ServiceBuilder::new().layer(stamp).service(http);

    for i in 1..=30 {
        let req = Request::builder()
            .method(Method::POST)
            .uri(format!("{proxy}{path}"))
            .header("content-type", "text/plain")
            .body(Full::new(Bytes::from(line.clone())))?;
        match writer.ready().await?.call(req).await {
            Ok(resp) => {
                let status = resp.status();
                let body = resp.into_body().collect().await?.to_bytes();
                match status {
                    s if s.is_success() => println!("write {i}: {s}"),
                    StatusCode::CONFLICT => {
                        // application/problem+json: resource, presented_token, current_epoch.
                        println!("write {i}: rejected, a newer holder has written: {}", String::from_utf8_lossy(&body));
                        break;
                    }
                    s => println!("write {i}: {s} {}", String::from_utf8_lossy(&body)),
                }
            }
            Err(StampedError::NotHeld(state)) => {
                println!("write {i}: not sent, the lease is {state}");
                break;
            }
            Err(e) => println!("write {i}: {e}"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    lease.release().await?;
    Ok(())
}
