//! What one signed token costs: signing a grant (what a coordinator leader
//! does once per grant) and parsing + verifying it (what a proxy does once
//! per write), on one core.
//!
//! ```text
//! cargo run --release -p fencer-token --example sign_cost -- [ITERATIONS]
//! ```
#![allow(clippy::disallowed_types)] // wall time of a loop; no lease or test clock is involved

use std::time::Instant;

use fencer_token::{KeyId, KeyRing, KeySet, PresentedToken, Signer};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: u32 = std::env::args().nth(1).map(|s| s.parse()).transpose()?.unwrap_or(50_000);
    let signer = Signer::generate(KeyId::new("n1-20261130105050")?)?;
    let now_ms = 1_796_000_000_000;
    let ring = KeyRing::new(&KeySet { keys: vec![signer.public_entry(now_ms - 1_000, None)] })?;
    let lease_id = 0x6cf4_a1b2_c3d4_e5f6_0718_293a_4b5c_6d7e;

    let started = Instant::now();
    let mut tokens = Vec::with_capacity(n as usize);
    for i in 0..n {
        tokens.push(signer.sign("orders/customer-42/invoice", u64::from(i) + 1, lease_id, now_ms)?.into_string());
    }
    let sign = started.elapsed() / n;

    let started = Instant::now();
    for t in &tokens {
        let PresentedToken::Signed(s) = PresentedToken::parse(t.as_bytes())? else { unreachable!() };
        ring.verify(&s, "orders/customer-42/invoice", now_ms)?;
    }
    let verify = started.elapsed() / n;
    println!(
        "{n} tokens of {} bytes: sign {:.1} µs each ({:.0}/s on one core), parse + verify {:.1} µs each ({:.0}/s)",
        tokens[0].len(),
        sign.as_secs_f64() * 1e6,
        1.0 / sign.as_secs_f64(),
        verify.as_secs_f64() * 1e6,
        1.0 / verify.as_secs_f64(),
    );
    Ok(())
}
