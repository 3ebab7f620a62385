//! fencer-client.
