//! Signed tokens and TLS between and into the nodes, in process:
//!
//! - `t75_signing` — grants carry a token signed with a registered key,
//!   also after failover (t76); rotation and retirement (t77).
//! - `t85_tls` — a TLS cluster replicates over mTLS and refuses plaintext;
//!   raft only from peer certificates (t86).

mod t75_signing;
mod t85_tls;
