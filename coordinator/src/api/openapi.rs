//! The OpenAPI 3.1 document of the JSON API, `docs/openapi.json`, served at
//! `GET /v1/openapi.json`. It is written by hand and kept true by tests:
//! here, that it names every error reason the API can answer with its
//! status, and that its paths are exactly the routes `api::http` declares;
//! in `coordinator/tests/lock_api/t36_json_api.rs`, that every operation it
//! lists answers on a real node, and that the real answers have exactly the
//! fields its schemas list.

use axum::http::header;
use axum::response::{IntoResponse, Response};

/// The document, as `docs/openapi.json` holds it.
pub(crate) const OPENAPI_JSON: &str = include_str!("../../../docs/openapi.json");

/// `GET /v1/openapi.json`.
pub(super) async fn document() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI_JSON).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::errors::HTTP_REASONS;
    use crate::service::LockError;

    /// One [`LockError`] of every variant. The match below has no wildcard:
    /// a new variant does not compile until it is listed here, and so until
    /// the document is checked for its reason.
    fn one_of_each() -> Vec<LockError> {
        use crate::state_machine::Reuse;
        use crate::types::{FencingToken, InvalidField, LeaseId};
        let all = vec![
            LockError::Invalid(InvalidField::PageToken),
            LockError::LockHeld { holder: String::new(), token: FencingToken(1) },
            LockError::WaitTimeout,
            LockError::TooManyWaiters { limit: 1 },
            LockError::NotHolder,
            LockError::LeaseExpired,
            LockError::RequestIdReused(Reuse::Resource),
            LockError::LeaseEnded {
                lease_id: LeaseId::from_u128(1),
                token: FencingToken(1),
                ttl_ms: 1,
                expires_at_unix_ms: 1,
                waited: false,
            },
            LockError::NotLeader { leader_id: None, leader_addr: None },
            LockError::NoQuorum,
            LockError::Unknown(String::new()),
            LockError::LeaderChanged,
            LockError::ShuttingDown,
            LockError::UnknownSigningKey(String::new()),
            LockError::SigningKeyRefused(String::new()),
            LockError::Internal(String::new()),
            LockError::Unauthenticated(String::new()),
            LockError::PermissionDenied { tenant: String::new(), permission: "acquire", resource: String::new() },
            LockError::TenantLimit { tenant: String::new(), limit: "max_waiters", value: 1 },
        ];
        for e in &all {
            match e {
                LockError::Invalid(_)
                | LockError::LockHeld { .. }
                | LockError::WaitTimeout
                | LockError::TooManyWaiters { .. }
                | LockError::NotHolder
                | LockError::LeaseExpired
                | LockError::RequestIdReused(_)
                | LockError::LeaseEnded { .. }
                | LockError::NotLeader { .. }
                | LockError::NoQuorum
                | LockError::Unknown(_)
                | LockError::LeaderChanged
                | LockError::ShuttingDown
                | LockError::UnknownSigningKey(_)
                | LockError::SigningKeyRefused(_)
                | LockError::Internal(_)
                | LockError::Unauthenticated(_)
                | LockError::PermissionDenied { .. }
                | LockError::TenantLimit { .. } => {}
            }
        }
        all
    }

    fn doc() -> serde_json::Value {
        serde_json::from_str(OPENAPI_JSON).expect("docs/openapi.json is JSON")
    }

    #[test]
    fn the_document_is_openapi_3_1() {
        let doc = doc();
        assert_eq!(doc["openapi"], "3.1.0");
        assert!(doc["paths"].as_object().is_some_and(|p| !p.is_empty()));
    }

    /// Every reason an error body can carry, with the HTTP status and gRPC
    /// code the API answers it with, is in the document's `Reason` schema
    /// and its status table, and the document lists no reason the API
    /// never answers.
    #[test]
    fn the_document_names_every_reason_with_its_status() {
        let doc = doc();
        let schema = &doc["components"]["schemas"]["Reason"];
        let listed: Vec<&str> = schema["enum"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
        let table = schema["x-fencer-status"].as_object().expect("Reason has its status table");
        let mut answered: Vec<&str> = HTTP_REASONS.to_vec();
        for e in one_of_each() {
            let (reason, status) = (e.reason(), crate::api::http_status(&e));
            assert!(listed.contains(&reason), "the document does not list {reason}");
            assert_eq!(table[reason]["http"], status, "{reason}'s HTTP status in the document");
            assert_eq!(
                table[reason]["grpc"],
                crate::api::errors::code_name(crate::api::grpc_code(&e)),
                "{reason}'s gRPC code in the document"
            );
            answered.push(reason);
        }
        for reason in &listed {
            assert!(answered.contains(reason), "the document lists {reason}, which the API never answers");
            assert!(table.contains_key(*reason), "{reason} has no status in the document");
        }
    }

    /// The routes `api::http` declares, as `(method, OpenAPI path)`, read
    /// from its source: `.route("/path/{*name}", get(handler))`.
    fn declared_routes() -> Vec<(String, String)> {
        let source = include_str!("http.rs");
        let mut routes = Vec::new();
        for line in source.lines().map(str::trim).filter(|l| l.starts_with(".route(\"")) {
            let rest = &line[".route(\"".len()..];
            let (path, rest) = rest.split_once('"').expect("a quoted path");
            let method = rest.trim_start_matches(',').trim().split('(').next().unwrap().to_string();
            routes.push((method, path.replace("{*", "{")));
        }
        routes.sort();
        routes
    }

    #[test]
    fn the_document_lists_exactly_the_routes() {
        let doc = doc();
        let mut listed = Vec::new();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for method in item.as_object().unwrap().keys() {
                listed.push((method.clone(), path.clone()));
            }
        }
        listed.sort();
        let declared = declared_routes();
        assert!(declared.len() >= 15, "the routes were read from http.rs: {declared:?}");
        assert_eq!(listed, declared, "docs/openapi.json paths against api::http's routes");
    }
}
