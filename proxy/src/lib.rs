//! fencer-proxy.
