//! The PostgreSQL v3 wire protocol, as far as the sidecar needs it (G1):
//! the startup packet and its special requests, message framing (a 1-byte
//! tag and a 4-byte big-endian length that counts itself), the few message
//! bodies the rules inspect, and the messages the sidecar writes itself.
//! Every parser here takes untrusted bytes: it bounds what it reads and
//! answers malformed input with a [`ProtocolError`] naming the problem,
//! never a panic.

use bytes::{BufMut, Bytes, BytesMut};

/// `SSLRequest`'s request code.
pub(crate) const SSL_REQUEST: u32 = 80_877_103;
/// `GSSENCRequest`'s request code.
pub(crate) const GSSENC_REQUEST: u32 = 80_877_104;
/// `CancelRequest`'s request code.
pub(crate) const CANCEL_REQUEST: u32 = 80_877_102;

/// PostgreSQL's own bound on a startup packet (`MAX_STARTUP_PACKET_LENGTH`).
pub(crate) const MAX_STARTUP_PACKET: usize = 10_000;
/// PostgreSQL's bound on the small frontend messages (`PQ_SMALL_MESSAGE_LIMIT`:
/// Close, Describe, Execute, Flush, Sync, CopyDone, CopyFail, Terminate).
pub(crate) const SMALL_MESSAGE_LIMIT: usize = 10_000;
/// PostgreSQL's bound on every other message (`PQ_LARGE_MESSAGE_LIMIT`).
pub(crate) const LARGE_MESSAGE_LIMIT: usize = 0x3fff_ffff;
/// Longest cancel key protocol 3.2 allows.
pub(crate) const MAX_CANCEL_KEY: usize = 256;

/// Why a client's or the upstream's bytes could not be understood. The
/// connection is closed with the reason logged (and, for a client, sent
/// as a `FATAL 08P01`); other connections are never affected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ProtocolError {
    #[error("a startup packet of {0} bytes is outside 8..={MAX_STARTUP_PACKET}")]
    StartupLength(usize),
    #[error("unsupported protocol version {major}.{minor} (this sidecar speaks 3.0 and 3.2)")]
    Version { major: u16, minor: u16 },
    #[error("the startup packet's parameters are malformed: {0}")]
    StartupParameters(&'static str),
    #[error("a CancelRequest of {0} bytes is malformed")]
    CancelLength(usize),
    #[error("message type {tag:?} has an invalid length {len}")]
    Length { tag: char, len: u32 },
    #[error("message type {tag:?} of {len} bytes exceeds the limit of {limit} bytes")]
    TooLarge { tag: char, len: usize, limit: usize },
    #[error("invalid frontend message type {0:?}")]
    UnknownFrontendTag(char),
    #[error("message type {tag:?} is malformed: {what}")]
    Body { tag: char, what: &'static str },
}

/// The first packet of a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Startup {
    /// Asks for TLS; answered `S` (then the handshake) or `N`.
    Ssl,
    /// Asks for GSSAPI encryption; always answered `N`.
    GssEnc,
    /// Cancels a running statement of another connection.
    Cancel { raw: Bytes, pid: u32, key: Bytes },
    /// A StartupMessage: the protocol version and the parameters.
    Message { raw: Bytes, version: u32, params: Vec<(String, String)> },
}

impl Startup {
    /// The parameter `name` of a StartupMessage.
    pub(crate) fn param(&self, name: &str) -> Option<&str> {
        match self {
            Self::Message { params, .. } => params.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str()),
            _ => None,
        }
    }
}

/// The declared length of a startup packet from its first four bytes.
pub(crate) fn startup_length(head: [u8; 4]) -> Result<usize, ProtocolError> {
    let len = u32::from_be_bytes(head) as usize;
    if !(8..=MAX_STARTUP_PACKET).contains(&len) {
        return Err(ProtocolError::StartupLength(len));
    }
    Ok(len)
}

/// Parses a whole startup packet (length prefix included).
pub(crate) fn parse_startup(packet: Bytes) -> Result<Startup, ProtocolError> {
    let len = packet.len();
    if !(8..=MAX_STARTUP_PACKET).contains(&len) {
        return Err(ProtocolError::StartupLength(len));
    }
    let code = u32::from_be_bytes([packet[4], packet[5], packet[6], packet[7]]);
    match code {
        SSL_REQUEST | GSSENC_REQUEST if len != 8 => Err(ProtocolError::StartupLength(len)),
        SSL_REQUEST => Ok(Startup::Ssl),
        GSSENC_REQUEST => Ok(Startup::GssEnc),
        CANCEL_REQUEST => {
            // 3.0: a 4-byte key; 3.2: up to 256 bytes.
            if !(16..=12 + MAX_CANCEL_KEY).contains(&len) {
                return Err(ProtocolError::CancelLength(len));
            }
            let pid = u32::from_be_bytes([packet[8], packet[9], packet[10], packet[11]]);
            let key = packet.slice(12..);
            Ok(Startup::Cancel { raw: packet, pid, key })
        }
        version => {
            // Any 3.x: PostgreSQL answers a minor version it lacks (3.2,
            // PostgreSQL 18's longer cancel keys) with
            // NegotiateProtocolVersion, which is relayed.
            let (major, minor) = ((version >> 16) as u16, (version & 0xffff) as u16);
            if major != 3 {
                return Err(ProtocolError::Version { major, minor });
            }
            let params = parse_startup_params(&packet[8..])?;
            Ok(Startup::Message { raw: packet, version, params })
        }
    }
}

fn parse_startup_params(mut body: &[u8]) -> Result<Vec<(String, String)>, ProtocolError> {
    let mut params = Vec::new();
    loop {
        let (name, rest) = cstr(body).ok_or(ProtocolError::StartupParameters("a name is not terminated"))?;
        if name.is_empty() {
            if !rest.is_empty() {
                return Err(ProtocolError::StartupParameters("bytes follow the terminating empty name"));
            }
            return Ok(params);
        }
        let (value, rest) = cstr(rest).ok_or(ProtocolError::StartupParameters("a value is not terminated"))?;
        let name = std::str::from_utf8(name).map_err(|_| ProtocolError::StartupParameters("a name is not UTF-8"))?;
        let value = std::str::from_utf8(value).map_err(|_| ProtocolError::StartupParameters("a value is not UTF-8"))?;
        if params.iter().any(|(k, _)| k == name) {
            return Err(ProtocolError::StartupParameters("a parameter is repeated"));
        }
        params.push((name.to_owned(), value.to_owned()));
        body = rest;
    }
}

/// A NUL-terminated string at the start of `b` and what follows it.
pub(crate) fn cstr(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let nul = b.iter().position(|&c| c == 0)?;
    Some((&b[..nul], &b[nul + 1..]))
}

/// A message header: the tag and the length of what follows the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) tag: u8,
    /// Body bytes (the wire length minus its own four bytes).
    pub(crate) body_len: usize,
}

impl Header {
    /// Reads a header from the first five bytes of `b`.
    pub(crate) fn parse(b: &[u8]) -> Result<Option<Self>, ProtocolError> {
        if b.len() < 5 {
            return Ok(None);
        }
        let len = u32::from_be_bytes([b[1], b[2], b[3], b[4]]);
        if len < 4 {
            return Err(ProtocolError::Length { tag: char::from(b[0]), len });
        }
        Ok(Some(Self { tag: b[0], body_len: len as usize - 4 }))
    }

    /// Header plus body.
    pub(crate) fn total(&self) -> usize {
        5 + self.body_len
    }
}

/// How the sidecar treats one frontend message type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FrontendKind {
    /// Read whole (up to the limit) and inspected: Query, Parse, Execute,
    /// Close, Describe, Sync, Flush, CopyDone, CopyFail, Terminate.
    Whole { limit: usize },
    /// Only the first bytes are inspected (Bind: the portal and statement
    /// names), the rest streams.
    Prefix,
    /// Decided on the header alone, then streamed (FunctionCall).
    Streamed,
    /// Streamed without inspection (CopyData).
    Opaque,
}

/// The treatment of a frontend tag after startup, or an error for a tag
/// the protocol does not have.
pub(crate) fn frontend_kind(tag: u8, max_statement_bytes: usize) -> Result<FrontendKind, ProtocolError> {
    Ok(match tag {
        b'Q' | b'P' => FrontendKind::Whole { limit: max_statement_bytes },
        b'E' | b'C' | b'D' | b'S' | b'H' | b'c' | b'f' | b'X' => FrontendKind::Whole { limit: SMALL_MESSAGE_LIMIT },
        // The password / SASL messages are only valid during startup; a
        // stray one reaches PostgreSQL, which refuses it.
        b'p' => FrontendKind::Whole { limit: SMALL_MESSAGE_LIMIT },
        b'B' => FrontendKind::Prefix,
        b'F' => FrontendKind::Streamed,
        b'd' => FrontendKind::Opaque,
        other => return Err(ProtocolError::UnknownFrontendTag(char::from(other))),
    })
}

/// How much of a Bind is read before its names must have appeared.
pub(crate) const BIND_PREFIX_LIMIT: usize = 2 * 1024;

/// The portal and statement names at the start of a Bind body, when both
/// are complete within `prefix`.
pub(crate) fn bind_names(prefix: &[u8]) -> Option<(&[u8], &[u8])> {
    let (portal, rest) = cstr(prefix)?;
    let (statement, _) = cstr(rest)?;
    Some((portal, statement))
}

/// A Parse body: the statement name and its query text (in the client's
/// encoding; see [`ascii_prefix`]).
pub(crate) fn parse_message(body: &[u8]) -> Result<(&[u8], &[u8]), ProtocolError> {
    let bad = |what| ProtocolError::Body { tag: 'P', what };
    let (name, rest) = cstr(body).ok_or(bad("the statement name is not terminated"))?;
    let (query, _types) = cstr(rest).ok_or(bad("the query is not terminated"))?;
    Ok((name, query))
}

/// A Query body: the query text (in the client's encoding).
pub(crate) fn query_message(body: &[u8]) -> Result<&[u8], ProtocolError> {
    let bad = |what| ProtocolError::Body { tag: 'Q', what };
    let (query, rest) = cstr(body).ok_or(bad("the query is not terminated"))?;
    if !rest.is_empty() {
        return Err(bad("bytes follow the query"));
    }
    Ok(query)
}

/// The length of the ASCII prefix of `raw`. The sidecar recognises a
/// statement it forwards without fencing (a token declaration, `BEGIN`)
/// only inside this prefix. ASCII bytes mean the same in every client
/// encoding PostgreSQL supports: a multi-byte character always starts with
/// a byte of 0x80 or above (in SJIS, BIG5, GBK, UHC, GB18030 and JOHAB a
/// later byte of it may be ASCII, a `\` say, but only after such a start),
/// so PostgreSQL splits and reads that prefix exactly as the classifier
/// does. Past it every statement is fenced, whatever it looks like.
pub(crate) fn ascii_prefix(raw: &[u8]) -> usize {
    raw.iter().position(|b| !b.is_ascii()).unwrap_or(raw.len())
}

/// An Execute body: the portal name.
pub(crate) fn execute_portal(body: &[u8]) -> Result<&[u8], ProtocolError> {
    let (portal, rest) =
        cstr(body).ok_or(ProtocolError::Body { tag: 'E', what: "the portal name is not terminated" })?;
    if rest.len() != 4 {
        return Err(ProtocolError::Body { tag: 'E', what: "the row limit is missing" });
    }
    Ok(portal)
}

/// A Close or Describe body: `S` (statement) or `P` (portal), and the name.
pub(crate) fn target(tag: u8, body: &[u8]) -> Result<(u8, &[u8]), ProtocolError> {
    let bad = |what| ProtocolError::Body { tag: char::from(tag), what };
    let (&kind, rest) = body.split_first().ok_or(bad("empty"))?;
    if kind != b'S' && kind != b'P' {
        return Err(bad("the target is neither S nor P"));
    }
    let (name, rest) = cstr(rest).ok_or(bad("the name is not terminated"))?;
    if !rest.is_empty() {
        return Err(bad("bytes follow the name"));
    }
    Ok((kind, name))
}

/// The fields of an ErrorResponse or NoticeResponse body that the sidecar
/// reads: the SQLSTATE (`C`) and the message (`M`).
pub(crate) fn error_fields(body: &[u8]) -> (Option<&[u8]>, Option<&[u8]>) {
    let (mut code, mut message) = (None, None);
    let mut rest = body;
    while let Some((&field, after)) = rest.split_first() {
        if field == 0 {
            break;
        }
        let Some((value, after)) = cstr(after) else { break };
        match field {
            b'C' => code = Some(value),
            b'M' => message = Some(value),
            _ => {}
        }
        rest = after;
    }
    (code, message)
}

/// A BackendKeyData body: the backend's process id and its cancel key.
pub(crate) fn backend_key(body: &[u8]) -> Result<(u32, Bytes), ProtocolError> {
    if body.len() < 8 || body.len() > 4 + MAX_CANCEL_KEY {
        return Err(ProtocolError::Body { tag: 'K', what: "the key has an invalid length" });
    }
    let pid = u32::from_be_bytes([body[0], body[1], body[2], body[3]]);
    Ok((pid, Bytes::copy_from_slice(&body[4..])))
}

/// A ParameterStatus body: name and value.
pub(crate) fn parameter_status(body: &[u8]) -> Option<(&[u8], &[u8])> {
    let (name, rest) = cstr(body)?;
    let (value, _) = cstr(rest)?;
    Some((name, value))
}

/// `AuthenticationSASL`'s code inside an `R` message.
pub(crate) const AUTH_SASL: u32 = 10;

/// The mechanisms of an AuthenticationSASL body (after its 4-byte code).
pub(crate) fn sasl_mechanisms(body: &[u8]) -> Result<Vec<&[u8]>, ProtocolError> {
    let bad = |what| ProtocolError::Body { tag: 'R', what };
    let mut rest = body.get(4..).ok_or(bad("too short"))?;
    let mut out = Vec::new();
    loop {
        let (name, after) = cstr(rest).ok_or(bad("a mechanism name is not terminated"))?;
        if name.is_empty() {
            return Ok(out);
        }
        out.push(name);
        rest = after;
    }
}

/// An AuthenticationSASL message offering `mechanisms`.
pub(crate) fn sasl_offer(mechanisms: &[&[u8]]) -> Bytes {
    let mut body = BytesMut::new();
    body.put_u32(AUTH_SASL);
    for m in mechanisms {
        body.put_slice(m);
        body.put_u8(0);
    }
    body.put_u8(0);
    message(b'R', &body)
}

/// One message: tag, length, body.
pub(crate) fn message(tag: u8, body: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(5 + body.len());
    out.put_u8(tag);
    out.put_u32(u32::try_from(body.len() + 4).unwrap_or(u32::MAX));
    out.put_slice(body);
    out.freeze()
}

/// Severity of an ErrorResponse the sidecar writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Severity {
    /// The statement fails; the connection stays.
    Error,
    /// The connection is closed after it.
    Fatal,
}

/// An ErrorResponse: severity, SQLSTATE, message and optional detail and
/// hint. NUL bytes in the texts are dropped (they would end the field).
pub(crate) fn error_response(
    severity: Severity,
    sqlstate: &str,
    message_text: &str,
    detail: Option<&str>,
    hint: Option<&str>,
) -> Bytes {
    let sev = match severity {
        Severity::Error => "ERROR",
        Severity::Fatal => "FATAL",
    };
    let mut body = BytesMut::new();
    let mut field = |code: u8, text: &str| {
        body.put_u8(code);
        body.extend(text.bytes().filter(|&b| b != 0));
        body.put_u8(0);
    };
    field(b'S', sev);
    field(b'V', sev);
    field(b'C', sqlstate);
    field(b'M', message_text);
    if let Some(d) = detail {
        field(b'D', d);
    }
    if let Some(h) = hint {
        field(b'H', h);
    }
    body.put_u8(0);
    message(b'E', &body)
}

/// A Query message.
pub(crate) fn query(text: &str) -> Bytes {
    let mut body = BytesMut::with_capacity(text.len() + 1);
    body.put_slice(text.as_bytes());
    body.put_u8(0);
    message(b'Q', &body)
}

/// A Parse message of a named statement with no parameter types.
pub(crate) fn parse(name: &str, text: &str) -> Bytes {
    let mut body = BytesMut::with_capacity(name.len() + text.len() + 4);
    body.put_slice(name.as_bytes());
    body.put_u8(0);
    body.put_slice(text.as_bytes());
    body.put_u8(0);
    body.put_u16(0);
    message(b'P', &body)
}

/// A StartupMessage of `version` with `params` (the client's first
/// packet; the sidecar never writes one, its tests and fuzz checks do).
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn startup_message(version: u32, params: &[(&str, &str)]) -> Bytes {
    let mut body = BytesMut::new();
    body.put_u32(0);
    body.put_u32(version);
    for (k, v) in params {
        body.put_slice(k.as_bytes());
        body.put_u8(0);
        body.put_slice(v.as_bytes());
        body.put_u8(0);
    }
    body.put_u8(0);
    let len = u32::try_from(body.len()).unwrap_or(u32::MAX);
    body[..4].copy_from_slice(&len.to_be_bytes());
    body.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const PROTOCOL_3_0: u32 = 196_608;

    use super::startup_message as startup;

    #[test]
    fn startup_packets_parse() {
        let s = parse_startup(startup(PROTOCOL_3_0, &[("user", "app"), ("database", "shop")])).unwrap();
        assert_eq!(s.param("user"), Some("app"));
        assert_eq!(s.param("database"), Some("shop"));
        let ssl = Bytes::from([0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f].to_vec());
        assert_eq!(parse_startup(ssl).unwrap(), Startup::Ssl);
        let mut cancel = BytesMut::new();
        cancel.put_u32(16);
        cancel.put_u32(CANCEL_REQUEST);
        cancel.put_u32(4242);
        cancel.put_u32(7);
        match parse_startup(cancel.freeze()).unwrap() {
            Startup::Cancel { pid, key, .. } => assert_eq!((pid, key.as_ref()), (4242, &[0, 0, 0, 7][..])),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn malformed_startup_packets_are_refused_with_a_reason() {
        assert!(matches!(parse_startup(startup(2 << 16, &[])), Err(ProtocolError::Version { major: 2, .. })));
        let repeated = startup(PROTOCOL_3_0, &[("user", "a"), ("user", "b")]);
        assert!(matches!(parse_startup(repeated), Err(ProtocolError::StartupParameters(_))));
        let mut unterminated = startup(PROTOCOL_3_0, &[("user", "a")]).to_vec();
        unterminated.pop();
        assert!(parse_startup(Bytes::from(unterminated)).is_err());
        assert!(startup_length(9_999_999u32.to_be_bytes()).is_err());
        assert!(startup_length(4u32.to_be_bytes()).is_err());
    }

    #[test]
    fn error_responses_carry_their_fields() {
        let e = error_response(Severity::Error, "FN001", "stale\0token", Some("d"), None);
        assert_eq!(e[0], b'E');
        let (code, msg) = error_fields(&e[5..]);
        assert_eq!(code, Some(&b"FN001"[..]));
        assert_eq!(msg, Some(&b"staletoken"[..]));
    }

    #[test]
    fn sasl_offers_round_trip() {
        let offer = sasl_offer(&[b"SCRAM-SHA-256-PLUS", b"SCRAM-SHA-256"]);
        let mechs = sasl_mechanisms(&offer[5..]).unwrap();
        assert_eq!(mechs, vec![&b"SCRAM-SHA-256-PLUS"[..], &b"SCRAM-SHA-256"[..]]);
    }

    proptest! {
        #[test]
        fn no_parser_panics_on_arbitrary_bytes(data in proptest::collection::vec(any::<u8>(), 0..600)) {
            let b = Bytes::from(data.clone());
            let _ = parse_startup(b);
            let _ = Header::parse(&data);
            let _ = bind_names(&data);
            let _ = parse_message(&data);
            let _ = query_message(&data);
            let _ = execute_portal(&data);
            let _ = target(b'C', &data);
            let _ = error_fields(&data);
            let _ = backend_key(&data);
            let _ = parameter_status(&data);
            let _ = sasl_mechanisms(&data);
            if let Some(tag) = data.first() {
                let _ = frontend_kind(*tag, 1024);
            }
        }

        #[test]
        fn headers_round_trip(tag in any::<u8>(), body in proptest::collection::vec(any::<u8>(), 0..300)) {
            let m = message(tag, &body);
            let h = Header::parse(&m).unwrap().unwrap();
            prop_assert_eq!(h.tag, tag);
            prop_assert_eq!(h.body_len, body.len());
            prop_assert_eq!(h.total(), m.len());
        }

        #[test]
        fn startup_messages_round_trip(
            params in proptest::collection::btree_map("[a-z_]{1,12}", "[ -~]{0,20}", 0..6),
        ) {
            let list: Vec<(&str, &str)> = params.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let parsed = parse_startup(startup(PROTOCOL_3_0, &list)).unwrap();
            for (k, v) in &params {
                prop_assert_eq!(parsed.param(k), Some(v.as_str()));
            }
        }
    }
}
