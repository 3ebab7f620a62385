//! TLS and tenants at the edge of a node:
//!
//! - `t87_dev_tls` — `fencer dev --tls` as a process: certificates, printed
//!   flags, mTLS required.
//! - `t88_tenants` — tenant isolation (mTLS and bearer identities, gRPC and
//!   JSON), per-tenant limits (t89), a multi-node cluster with tenants needs
//!   peer mTLS.

mod t87_dev_tls;
mod t88_tenants;
