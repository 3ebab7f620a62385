//! A tiny key-value HTTP service to put behind `fencer proxy` when no real
//! database is at hand (the README's cluster walkthrough uses it). It knows
//! nothing about fencing, like the legacy databases the proxy protects.
//!
//! ```text
//! cargo run --example demo_upstream -- 127.0.0.1:8086
//! curl -XPUT 127.0.0.1:8086/kv/greeting --data 'hello'   # 204, printed on stdout
//! curl 127.0.0.1:8086/kv/greeting                         # hello
//! ```
//!
//! `PUT` or `POST /kv/{key}` stores the body; `GET /kv/{key}` returns it;
//! `GET /kv` lists the keys. Every applied write is printed with the
//! `Fencing-Token` header it arrived with, so you can watch which writes the
//! proxy let through. Limits: 64 KiB per value, 10,000 keys, loopback only.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

const MAX_VALUE_BYTES: usize = 64 * 1024;
const MAX_KEYS: usize = 10_000;

type Store = Arc<Mutex<BTreeMap<String, Bytes>>>;

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let addr: SocketAddr = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:8086".into()).parse()?;
    anyhow::ensure!(addr.ip().is_loopback(), "demo_upstream listens on loopback only, not {addr}");
    let listener = TcpListener::bind(addr).await?;
    eprintln!("demo_upstream: key-value service on http://{addr} (PUT/GET /kv/KEY); Ctrl-C stops it");
    let store: Store = Arc::default();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, _) = accepted?;
                let store = store.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| handle(req, store.clone()));
                    if let Err(e) = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await {
                        eprintln!("demo_upstream: connection error: {e}");
                    }
                });
            }
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}

async fn handle(req: Request<Incoming>, store: Store) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_owned();
    let token = req.headers().get("fencing-token").and_then(|v| v.to_str().ok()).unwrap_or("-").to_owned();
    let answer = |status: StatusCode, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        Ok(r)
    };
    if path == "/kv" && req.method() == Method::GET {
        let keys: Vec<String> = store.lock().unwrap_or_else(|p| p.into_inner()).keys().cloned().collect();
        return answer(StatusCode::OK, keys.join("\n") + "\n");
    }
    let Some(key) = path.strip_prefix("/kv/").filter(|k| !k.is_empty()).map(str::to_owned) else {
        return answer(StatusCode::NOT_FOUND, "use /kv/KEY\n".into());
    };
    match *req.method() {
        Method::GET => match store.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
            Some(v) => Ok(Response::new(Full::new(v.clone()))),
            None => answer(StatusCode::NOT_FOUND, format!("no key {key:?}\n")),
        },
        Method::PUT | Method::POST => {
            let body = match Limited::new(req.into_body(), MAX_VALUE_BYTES).collect().await {
                Ok(b) => b.to_bytes(),
                Err(e) => {
                    return answer(StatusCode::PAYLOAD_TOO_LARGE, format!("value over 64 KiB or unreadable: {e}\n"));
                }
            };
            let mut map = store.lock().unwrap_or_else(|p| p.into_inner());
            if map.len() >= MAX_KEYS && !map.contains_key(&key) {
                return answer(StatusCode::INSUFFICIENT_STORAGE, format!("at most {MAX_KEYS} keys\n"));
            }
            println!("applied  {key} = {:?}  (Fencing-Token: {token})", String::from_utf8_lossy(&body));
            map.insert(key, body);
            answer(StatusCode::NO_CONTENT, String::new())
        }
        _ => answer(StatusCode::METHOD_NOT_ALLOWED, "GET, PUT or POST\n".into()),
    }
}
