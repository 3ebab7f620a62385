//! An application that writes to an unmodified PostgreSQL through the
//! fencer sidecar (`fencer proxy --protocol postgres`, docs/postgres.md):
//! it takes a lease with the client library, declares the lease's fencing
//! token on its connection (`SET fencer.token = …`, the signed form when the
//! coordinator signs grants), and writes only while the lease is Held.
//!
//! ```text
//! fencer dev &                                               # coordinator on 127.0.0.1:7420
//! # a PostgreSQL on 127.0.0.1:5432 with a table:
//! #   CREATE TABLE jobs (id bigserial PRIMARY KEY, worker text, token bigint, at timestamptz DEFAULT now());
//! fencer proxy --protocol postgres --listen 127.0.0.1:6432 --upstream 127.0.0.1:5432 \
//!              --resource pg/app --data-dir ./pg-sidecar \
//!              --floor "$(fencer status -o json | jq .commit_index)" &
//! cargo run --example pg_writer -- 'host=127.0.0.1 port=6432 user=app dbname=app' pg/app worker-1
//! ```
//! Run two copies: the second waits for the lock. Pause the first
//! (`kill -STOP`) past its ttl and resume it (`kill -CONT`): it stops
//! writing because its lease is Lost, and an INSERT that was already on its
//! way is refused by the sidecar with SQLSTATE FN001, because the second
//! copy's larger token has reached PostgreSQL since.

use std::time::Duration;

use fencer_client::Client;

const TTL: Duration = Duration::from_secs(10);

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let conninfo = args.next().unwrap_or_else(|| "host=127.0.0.1 port=6432 user=app dbname=app".into());
    let resource = args.next().unwrap_or_else(|| "pg/app".into());
    let worker = args.next().unwrap_or_else(|| format!("worker-{}", std::process::id()));
    let endpoints = std::env::var("FENCER_ENDPOINTS").unwrap_or_else(|_| fencer_client::DEFAULT_ENDPOINT.into());

    let client = Client::new(endpoints.split(','))?;
    eprintln!("waiting for the lock on {resource} …");
    let lease = client.acquire(resource.as_str()).ttl(TTL).wait(Duration::from_secs(120)).await?;
    eprintln!("holding {resource} with fencing token {}", lease.token());

    let (db, connection) = tokio_postgres::connect(&conninfo, tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            eprintln!("connection ended: {e}");
        }
    });
    // The declaration: the signed token when the coordinator signs grants
    // (a proxy with signing keys accepts nothing else), the number when not.
    let declared = match lease.signed_token() {
        Some(signed) => format!("SET fencer.token = '{signed}'"),
        None => format!("SET fencer.token = {}", lease.token()),
    };
    db.batch_execute(&declared).await?;

    let insert = db.prepare("INSERT INTO jobs (worker, token) VALUES ($1, $2)").await?;
    let token = i64::try_from(lease.token().get())?;
    for i in 1..=30 {
        // Start a piece of work only while the lease is Held.
        if !lease.is_held() {
            eprintln!("lease no longer held ({:?}); stopping", lease.check());
            break;
        }
        match db.execute(&insert, &[&worker, &token]).await {
            Ok(_) => eprintln!("write {i}: ok"),
            Err(e) => {
                let code = e.as_db_error().map(|d| d.code().code().to_owned()).unwrap_or_default();
                eprintln!("write {i}: refused ({code}): {e}");
                if code == "FN001" {
                    // A newer holder exists: never retry with this token.
                    break;
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // Clear the token before the connection could go back to a pool.
    let _ = db.batch_execute("DISCARD ALL").await;
    if lease.is_held() {
        lease.release().await?;
    }
    Ok(())
}
