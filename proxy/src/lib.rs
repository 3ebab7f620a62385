//! fencer-proxy (WIP)
mod clock;
mod config;
mod epoch_store;
mod names;
mod rejections;
mod routes;
pub use self::{
    config::{ConfigError, Limits, ProxyConfig, SimpleConfig, Timeouts},
    epoch_store::{EpochStore, OpenError, StoreError, StoreSnapshot},
    names::{FencingToken, ResourceName, ResourceNameError, TokenParseError},
    rejections::{RejectReason, RejectionRecord, RejectionsPage},
    routes::{PatternError, Route, RouteKind, Router},
};
