//! Splits a simple-Query string into statements the way PostgreSQL's
//! scanner does, and recognises the few statement shapes the sidecar acts
//! on without fencing them (DESIGN §4a: G2 token declaration, G3, G8).
//!
//! The sidecar does not decide read vs write from SQL (G3): on a connection
//! with a token every statement is fenced. It only needs to know where the
//! statements of a Query message are, and whether one of them is exactly a
//! token declaration, a reset, a `BEGIN`, a two-phase command or a
//! `COPY … FROM STDIN`.
//!
//! # The safety rule
//! A statement is classified [`StatementKind::SetToken`], `ResetToken`,
//! `SetResource`, `ResetResource`, `ResetAll`, `DiscardAll` or `Begin` only
//! when its whole token stream has exactly that shape: no extra token, no
//! unterminated construct, no literal whose meaning differs between
//! PostgreSQL versions. Those statements are forwarded without fencing, so a
//! misclassified write would escape the fence; when in doubt a statement is
//! [`StatementKind::Other`] (fenced), or [`StatementKind::UnsupportedFencerSetting`]
//! (refused, with a reason naming the supported form) when it is a `SET` or
//! `RESET` that names `fencer.token` or `fencer.resource`.
//! [`StatementKind::TwoPhase`] goes the other way: it is refused (G8), so
//! every `PREPARE TRANSACTION`, `COMMIT PREPARED` and `ROLLBACK PREPARED` is
//! one, whatever follows.
//!
//! # Lexical rules
//! The rules of `src/backend/parser/scan.l` (PostgreSQL 15 and later):
//! whitespace and `--` comments; nested `/* */` comments, also inside
//! operator characters (`+/*`); string constants `'…'` (`''` is a quote;
//! backslash escapes when `standard_conforming_strings` is off), `E'…'`,
//! `U&'…'` with `UESCAPE`, `B'…'` and `X'…'` (no `''` inside), `N'…'`;
//! string continuation over whitespace that holds a newline; dollar quotes
//! `$tag$…$tag$` (not `$1`, not the `$` inside an identifier such as `a$b$`,
//! nor after a number: `1$a$` is `1` then a dollar quote); quoted identifiers
//! `"…"` and `U&"…"`; and the numeric, operator and junk rules that decide
//! where a token ends. Vertical tab is not whitespace (PostgreSQL 15; later
//! versions accept it), so a declaration that uses it is not recognised.
//!
//! Statements end at a `;` outside parentheses (psql's rule; PostgreSQL
//! rejects a `;` inside parentheses) and outside SQL-standard function
//! bodies: in `CREATE [OR REPLACE] FUNCTION|PROCEDURE … BEGIN ATOMIC … END`
//! the body's own statements do not split the statement. A body ends at an
//! `END` that begins one of its statements, as in PostgreSQL's grammar; this
//! is stricter than psql's heuristic, which also counts the `end` of a
//! column label (`SELECT 1 AS end`) and would join the next statement.
//!
//! The whole Query string is lexed with one `standard_conforming_strings`
//! value, as PostgreSQL does: a `SET standard_conforming_strings` inside the
//! string applies from the next Query message on.
//!
//! Text is read as UTF-8 and as the server reads it: the caller must only
//! pass text whose client encoding is ASCII-safe (UTF8, SQL_ASCII, LATIN*,
//! EUC_*…). In the client-only encodings SJIS, BIG5, GBK, UHC, GB18030 and
//! JOHAB a multi-byte character may end in a `\` byte, which this lexer
//! would read as an escape.
//!
//! # Cost
//! One pass over the text, linear in its length, no regular expressions. The
//! only allocations are the returned `Vec` and, for a declaration, its
//! decoded value; a statement that cannot be one of the recognised shapes
//! (its first keyword says so) is not looked at twice.

use std::fmt;
use std::ops::Range;

#[cfg(test)]
mod tests;

/// The `keyword` of an empty statement (only [`classify_one`] returns one).
pub(crate) const EMPTY_KEYWORD: &str = "(empty)";
/// The `keyword` of a statement whose first token is `(`.
pub(crate) const PAREN_KEYWORD: &str = "(";
/// The `keyword` of a statement whose first token is not a known statement
/// keyword (a string, a number, a quoted identifier, an unknown word…).
pub(crate) const UNKNOWN_KEYWORD: &str = "?";

/// The words a PostgreSQL statement can begin with (`stmt` in gram.y),
/// sorted. A statement's `keyword` is one of these, so the rejection log
/// never carries an identifier, a number or a string from the statement.
#[rustfmt::skip]
const STATEMENT_KEYWORDS: &[&str] = &[
    "ABORT", "ALTER", "ANALYSE", "ANALYZE", "BEGIN", "CALL", "CHECKPOINT", "CLOSE", "CLUSTER", "COMMENT", "COMMIT",
    "COPY", "CREATE", "DEALLOCATE", "DECLARE", "DELETE", "DISCARD", "DO", "DROP", "END", "EXECUTE", "EXPLAIN", "FETCH",
    "GRANT", "IMPORT", "INSERT", "LISTEN", "LOAD", "LOCK", "MERGE", "MOVE", "NOTIFY", "PREPARE", "REASSIGN", "REFRESH",
    "REINDEX", "RELEASE", "RESET", "RETURN", "REVOKE", "ROLLBACK", "SAVEPOINT", "SECURITY", "SELECT", "SET", "SHOW",
    "START", "TABLE", "TRUNCATE", "UNLISTEN", "UPDATE", "VACUUM", "VALUES", "WITH",
];

/// PostgreSQL's reserved keywords (`pg_get_keywords()` category `R`): not a
/// `SET` value, except `TRUE`, `FALSE` and `ON` (and `DEFAULT`, which resets).
#[rustfmt::skip]
const RESERVED_KEYWORDS: &[&str] = &[
    "ALL", "ANALYSE", "ANALYZE", "AND", "ANY", "ARRAY", "AS", "ASC", "ASYMMETRIC", "BOTH", "CASE", "CAST", "CHECK",
    "COLLATE", "COLUMN", "CONSTRAINT", "CREATE", "CURRENT_CATALOG", "CURRENT_DATE", "CURRENT_ROLE", "CURRENT_TIME",
    "CURRENT_TIMESTAMP", "CURRENT_USER", "DEFAULT", "DEFERRABLE", "DESC", "DISTINCT", "DO", "ELSE", "END", "EXCEPT",
    "FALSE", "FETCH", "FOR", "FOREIGN", "FROM", "GRANT", "GROUP", "HAVING", "IN", "INITIALLY", "INTERSECT", "INTO",
    "LATERAL", "LEADING", "LIMIT", "LOCALTIME", "LOCALTIMESTAMP", "NOT", "NULL", "OFFSET", "ON", "ONLY", "OR", "ORDER",
    "PLACING", "PRIMARY", "REFERENCES", "RETURNING", "SELECT", "SESSION_USER", "SOME", "SYMMETRIC", "TABLE", "THEN",
    "TO", "TRAILING", "TRUE", "UNION", "UNIQUE", "USER", "USING", "VARIADIC", "WHEN", "WHERE", "WINDOW", "WITH",
];

/// PostgreSQL truncates identifiers to `NAMEDATALEN - 1` bytes.
const MAX_IDENTIFIER_BYTES: usize = 63;

/// One statement of a Query string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Statement {
    /// Where it is in the text: from its first token to the end of its last
    /// (the terminating `;` excluded); to the end of the text if incomplete.
    pub(crate) range: Range<usize>,
    /// Its first keyword, upper-cased: one of a fixed list of statement
    /// keywords, or [`PAREN_KEYWORD`], [`UNKNOWN_KEYWORD`] or
    /// [`EMPTY_KEYWORD`]. Safe for the operator log: it never holds text
    /// from the statement beyond the keyword itself, and is at most 10 bytes.
    pub(crate) keyword: &'static str,
    /// What the sidecar does with it.
    pub(crate) kind: StatementKind,
    /// A string, quoted identifier, dollar quote or `/*` comment runs to the
    /// end of the text (PostgreSQL rejects the whole Query). Such a
    /// statement is always [`StatementKind::Other`].
    pub(crate) incomplete: bool,
}

/// The shapes the sidecar recognises; everything else is `Other`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StatementKind {
    /// `SET [SESSION] fencer.token {= | TO} <literal>`: the decoded value,
    /// exactly what `SHOW fencer.token` returns afterwards.
    SetToken(String),
    /// `RESET fencer.token` or `SET [SESSION] fencer.token {= | TO} DEFAULT`.
    ResetToken,
    /// `SET [SESSION] fencer.resource {= | TO} <literal>` (G10: a check).
    SetResource(String),
    /// `RESET fencer.resource` or `SET … fencer.resource … DEFAULT`.
    ResetResource,
    /// `RESET ALL` (clears the token too).
    ResetAll,
    /// `DISCARD ALL` (clears the token too).
    DiscardAll,
    /// Any other `SET` or `RESET` that names `fencer.token` or
    /// `fencer.resource`: refused with this reason.
    UnsupportedFencerSetting(Unsupported),
    /// `BEGIN` or `START TRANSACTION`, with any transaction modes.
    Begin,
    /// A two-phase commit command (refused on fenced connections, G8).
    TwoPhase(TwoPhase),
    /// `COPY table [(columns)] FROM STDIN …`: the client sends CopyData next.
    /// A hint for the relay; the server's CopyInResponse is authoritative.
    CopyFromStdin,
    /// Everything else.
    Other,
}

/// The two-phase commit commands (G8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TwoPhase {
    /// `PREPARE TRANSACTION 'gid'`.
    PrepareTransaction,
    /// `COMMIT PREPARED 'gid'`.
    CommitPrepared,
    /// `ROLLBACK PREPARED 'gid'`.
    RollbackPrepared,
}

/// Why a `SET`/`RESET` of a fencer setting is refused. `Display` names the
/// problem and the supported form, for the client's error message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unsupported {
    /// `SET LOCAL` (the token is per connection, not per transaction).
    Local,
    /// `SET … FROM CURRENT`.
    FromCurrent,
    /// More than one value (`SET fencer.token = 1, 2`).
    List,
    /// The value is not one plain literal: a `$1` parameter, an expression,
    /// a signed, fractional or non-decimal number, a reserved word, `B''`,
    /// `X''` or `N''`.
    NotALiteral,
    /// The literal is one PostgreSQL rejects, truncates, or reads
    /// differently across versions: a bad or `\v` escape, a NUL or invalid
    /// UTF-8, `U&''` with `standard_conforming_strings` off, an identifier
    /// over 63 bytes, an empty quoted identifier.
    InvalidLiteral,
    /// Anything else: a missing value, extra tokens, an unknown form.
    Malformed,
}

impl Unsupported {
    /// The problem, without the supported form.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            Self::Local => "SET LOCAL of a fencer setting is not supported (the token belongs to the connection)",
            Self::FromCurrent => "SET … FROM CURRENT of a fencer setting is not supported",
            Self::List => "a fencer setting takes exactly one value",
            Self::NotALiteral => {
                "the value of a fencer setting must be one unsigned decimal integer or one string constant, not a parameter, expression, signed, fractional or non-decimal number, reserved word, B'', X'' or N'' constant"
            }
            Self::InvalidLiteral => {
                "the value of a fencer setting is a literal PostgreSQL rejects, truncates or reads differently across versions (bad or \\v escape, NUL, invalid UTF-8, U&'' with standard_conforming_strings off, identifier over 63 bytes)"
            }
            Self::Malformed => "this form of SET or RESET of a fencer setting is not supported",
        }
    }

    /// The forms the sidecar understands.
    pub(crate) const SUPPORTED: &'static str = "declare the token with SET [SESSION] fencer.token {= | TO} <value>, where <value> is one unsigned decimal integer or one string constant (SET fencer.token = 42, SET fencer.token = 'v1.…'), and clear it with RESET fencer.token, SET fencer.token TO DEFAULT, RESET ALL or DISCARD ALL; fencer.resource takes the same forms";
}

impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.reason(), Self::SUPPORTED)
    }
}

/// Splits a simple-Query string into its statements. Empty statements
/// (`;;`, only whitespace or comments) produce none. An unterminated
/// construct makes the last statement run to the end, `incomplete`.
pub(crate) fn split_statements(sql: &str, standard_conforming_strings: bool) -> Vec<Statement> {
    let mut out = Vec::new();
    let lexer = Lexer::new(sql, standard_conforming_strings);
    let mut nesting = Nesting::default();
    // The current statement: its first token and the end of its last.
    let mut current: Option<(Token<'_>, usize)> = None;
    for tok in lexer {
        if tok.kind == Kind::Unterminated {
            let first = current.map_or(tok, |(first, _)| first);
            out.push(Statement {
                range: first.start..sql.len(),
                keyword: keyword_of(&first),
                kind: StatementKind::Other,
                incomplete: true,
            });
            return out;
        }
        if tok.is_punct(";") && nesting.at_top() {
            if let Some((first, end)) = current.take() {
                out.push(finish(sql, first, end, standard_conforming_strings));
            }
            nesting = Nesting::default();
            continue;
        }
        nesting.feed(&tok);
        current = Some((current.map_or(tok, |(first, _)| first), tok.end()));
    }
    if let Some((first, end)) = current {
        out.push(finish(sql, first, end, standard_conforming_strings));
    }
    out
}

/// Classifies the one statement of an extended-protocol Parse message. Text
/// with several statements (PostgreSQL refuses it in a Parse) is `Other`,
/// with the first statement's keyword; empty text is `Other` with
/// [`EMPTY_KEYWORD`].
pub(crate) fn classify_one(sql: &str, standard_conforming_strings: bool) -> Statement {
    let mut statements = split_statements(sql, standard_conforming_strings).into_iter();
    let Some(first) = statements.next() else {
        return Statement { range: 0..0, keyword: EMPTY_KEYWORD, kind: StatementKind::Other, incomplete: false };
    };
    match statements.last() {
        None => first,
        Some(last) => Statement {
            range: first.range.start..last.range.end,
            keyword: first.keyword,
            kind: StatementKind::Other,
            incomplete: last.incomplete,
        },
    }
}

fn finish(sql: &str, first: Token<'_>, end: usize, scs: bool) -> Statement {
    let keyword = keyword_of(&first);
    let text = &sql[first.start..end];
    Statement { range: first.start..end, keyword, kind: classify(keyword, text, scs), incomplete: false }
}

fn keyword_of(first: &Token<'_>) -> &'static str {
    match first.kind {
        Kind::Word => lookup_upper(first.text, STATEMENT_KEYWORDS).unwrap_or(UNKNOWN_KEYWORD),
        Kind::Punct if first.text == "(" => PAREN_KEYWORD,
        _ => UNKNOWN_KEYWORD,
    }
}

/// `word` upper-cased, if it is in the sorted upper-case `list`.
fn lookup_upper(word: &str, list: &'static [&'static str]) -> Option<&'static str> {
    const LONGEST: usize = 17; // CURRENT_TIMESTAMP
    if word.len() > LONGEST {
        return None;
    }
    let mut buf = [0u8; LONGEST];
    let upper = &mut buf[..word.len()];
    upper.copy_from_slice(word.as_bytes());
    upper.make_ascii_uppercase();
    list.binary_search_by(|k| k.as_bytes().cmp(upper)).ok().map(|i| list[i])
}

/// Where a `;` ends a statement: parentheses and `BEGIN ATOMIC` bodies.
#[derive(Debug, Default)]
struct Nesting {
    parens: usize,
    /// Open `BEGIN ATOMIC` bodies.
    bodies: usize,
    /// The innermost (body) statement has no token yet.
    at_start: bool,
    routine: Routine,
    /// The last token was `begin` in a routine definition.
    after_begin: bool,
}

/// How far the current (innermost) statement matches
/// `CREATE [OR REPLACE] FUNCTION|PROCEDURE`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Routine {
    #[default]
    Start,
    Create,
    CreateOr,
    CreateOrReplace,
    Yes,
    No,
}

impl Nesting {
    fn at_top(&self) -> bool {
        self.parens == 0 && self.bodies == 0
    }

    /// Every token of a statement except a `;` that ends it.
    fn feed(&mut self, tok: &Token<'_>) {
        let after_begin = std::mem::take(&mut self.after_begin);
        if self.parens == 0 {
            if tok.is_punct(";") {
                // The end of a statement inside a body.
                self.at_start = true;
                self.routine = Routine::Start;
                return;
            }
            if after_begin && tok.is_word("atomic") {
                self.bodies += 1;
                self.at_start = true;
                self.routine = Routine::Start;
                return;
            }
            if self.bodies > 0 && self.at_start && tok.is_word("end") {
                // Back in the routine definition that opened the body.
                self.bodies -= 1;
                self.at_start = false;
                self.routine = Routine::Yes;
                return;
            }
            if self.routine == Routine::Yes && tok.is_word("begin") {
                self.after_begin = true;
            }
        }
        self.at_start = false;
        self.routine = match (self.routine, tok.kind == Kind::Word) {
            (Routine::Start, true) if tok.is_word("create") => Routine::Create,
            (Routine::Create, true) if tok.is_word("or") => Routine::CreateOr,
            (Routine::CreateOr, true) if tok.is_word("replace") => Routine::CreateOrReplace,
            (Routine::Create | Routine::CreateOrReplace, true)
                if tok.is_word("function") || tok.is_word("procedure") =>
            {
                Routine::Yes
            }
            (Routine::Yes, _) => Routine::Yes,
            _ => Routine::No,
        };
        if tok.is_punct("(") {
            self.parens += 1;
        } else if tok.is_punct(")") {
            self.parens = self.parens.saturating_sub(1);
        }
    }
}

// ---------------------------------------------------------------------------
// Lexer
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// An unquoted identifier or keyword, as written.
    Word,
    /// `"…"`.
    QuotedIdent,
    /// `U&"…"`.
    UnicodeIdent,
    /// A string constant, with its prefix and every continued part.
    Str(Quote),
    /// A numeric constant, or a number with trailing junk (`1_000`, `0x1f`,
    /// `1abc`): PostgreSQL 15 rejects junk, later versions read some of it.
    Number,
    /// `$1`.
    Param,
    /// A run of operator characters, cut as PostgreSQL cuts it.
    Op,
    /// `( ) , ; [ ] . .. : :: :=`.
    Punct,
    /// Any other character (`\`, `{`, a control character…).
    Other,
    /// A string, quoted identifier, dollar quote or comment that runs to the
    /// end of the text; always the last token.
    Unterminated,
}

/// The kinds of string constant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Quote {
    /// `'…'` with `standard_conforming_strings` on: `''` is a quote.
    Standard,
    /// `E'…'`, or `'…'` with `standard_conforming_strings` off: backslash
    /// escapes too.
    Escaped,
    /// `U&'…'`: `''`, then Unicode escapes after the lexer.
    Unicode,
    /// `B'…'`: no `''`, no escapes.
    Bit,
    /// `X'…'`: no `''`, no escapes.
    Hex,
    /// `$tag$…$tag$`.
    Dollar,
}

#[derive(Debug, Clone, Copy)]
struct Token<'a> {
    kind: Kind,
    text: &'a str,
    start: usize,
}

impl Token<'_> {
    fn end(&self) -> usize {
        self.start + self.text.len()
    }

    fn is_word(&self, word: &str) -> bool {
        self.kind == Kind::Word && self.text.eq_ignore_ascii_case(word)
    }

    fn is_punct(&self, punct: &str) -> bool {
        self.kind == Kind::Punct && self.text == punct
    }

    fn is_op(&self, op: &str) -> bool {
        self.kind == Kind::Op && self.text == op
    }
}

/// The tokens of a text, whitespace and comments skipped.
#[derive(Debug, Clone)]
struct Lexer<'a> {
    sql: &'a str,
    pos: usize,
    scs: bool,
    done: bool,
}

fn is_space(c: u8) -> bool {
    // PostgreSQL 15's {space}; later versions add \v.
    matches!(c, b' ' | b'\t' | b'\n' | b'\r' | 0x0c)
}

fn is_ident_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_' || c >= 0x80
}

fn is_ident_cont(c: u8) -> bool {
    is_ident_start(c) || c.is_ascii_digit() || c == b'$'
}

fn is_dollar_tag_cont(c: u8) -> bool {
    is_ident_start(c) || c.is_ascii_digit()
}

fn is_op_char(c: u8) -> bool {
    b"~!@#^&|`?+-*/%<>=".contains(&c)
}

/// The end of a `--` comment at `i`: the next newline (not included).
fn line_end(b: &[u8], i: usize) -> usize {
    b[i..].iter().position(|&c| c == b'\n' || c == b'\r').map_or(b.len(), |n| i + n)
}

/// The end of the `/* */` comment opening at `i`, nested comments included.
fn block_comment_end(b: &[u8], i: usize) -> Option<usize> {
    let mut depth = 1usize;
    let mut i = i + 2;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'*') => {
                depth += 1;
                i += 2;
            }
            b'*' => {
                while b.get(i) == Some(&b'*') {
                    i += 1;
                }
                if b.get(i) == Some(&b'/') {
                    i += 1;
                    depth -= 1;
                    if depth == 0 {
                        return Some(i);
                    }
                }
            }
            _ => i += 1,
        }
    }
    None
}

/// The closing quote of a string part whose content starts at `i`.
fn part_close(b: &[u8], mut i: usize, quote: Quote) -> Option<usize> {
    loop {
        match *b.get(i)? {
            b'\'' => {
                if b.get(i + 1) == Some(&b'\'') && !matches!(quote, Quote::Bit | Quote::Hex) {
                    i += 2;
                } else {
                    return Some(i);
                }
            }
            b'\\' if quote == Quote::Escaped => i += 2,
            _ => i += 1,
        }
    }
}

/// If the string part that closed just before `i` continues (whitespace with
/// at least one newline, then a quote), the index of the next opening quote.
fn continuation(b: &[u8], mut i: usize) -> Option<usize> {
    loop {
        match b.get(i) {
            Some(b' ' | b'\t' | 0x0c) => i += 1,
            Some(b'-') if b.get(i + 1) == Some(&b'-') => i = line_end(b, i),
            _ => break,
        }
    }
    if !matches!(b.get(i), Some(b'\n' | b'\r')) {
        return None;
    }
    i += 1;
    loop {
        match b.get(i) {
            Some(&c) if is_space(c) => i += 1,
            Some(b'-') if b.get(i + 1) == Some(&b'-') => i = line_end(b, i),
            _ => break,
        }
    }
    (b.get(i) == Some(&b'\'')).then_some(i)
}

/// The end of the string constant whose first quote is at `open`.
fn string_end(b: &[u8], open: usize, quote: Quote) -> Option<usize> {
    let mut open = open;
    loop {
        let close = part_close(b, open + 1, quote)?;
        match continuation(b, close + 1) {
            Some(next) => open = next,
            None => return Some(close + 1),
        }
    }
}

/// The end of the quoted identifier whose quote is at `open`.
fn quoted_ident_end(b: &[u8], open: usize) -> Option<usize> {
    let mut i = open + 1;
    loop {
        match *b.get(i)? {
            b'"' if b.get(i + 1) == Some(&b'"') => i += 2,
            b'"' => return Some(i + 1),
            _ => i += 1,
        }
    }
}

fn ident_end(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && is_ident_cont(b[i]) {
        i += 1;
    }
    i
}

/// The end of a number at `start` (a digit, or `.` before a digit), junk
/// included, as the {decinteger}, {numeric}, {real}, *fail and *_junk rules
/// cut it.
fn number_end(b: &[u8], start: usize) -> usize {
    let digits = |mut i: usize| {
        while i < b.len() && (b[i].is_ascii_digit() || b[i] == b'_') {
            i += 1;
        }
        i
    };
    let mut i = start;
    if b[i] == b'.' {
        i = digits(i + 1);
    } else {
        i = digits(i);
        if b.get(i) == Some(&b'.') {
            if b.get(i + 1) == Some(&b'.') {
                // {numericfail}: `1..` is the integer then `..`.
                return i;
            }
            i = digits(i + 1);
        }
    }
    if matches!(b.get(i), Some(b'e' | b'E')) && matches!(b.get(i + 1), Some(b'+' | b'-')) {
        if !b.get(i + 2).is_some_and(u8::is_ascii_digit) {
            // {realfail}: `1e-` is one (bad) token.
            return i + 2;
        }
        i = digits(i + 2);
    }
    if i < b.len() && is_ident_start(b[i]) {
        // {integer_junk} and friends; also `1e5`, `0x1f`.
        i = ident_end(b, i);
    }
    i
}

/// The end of the operator starting at `start`, as scan.l's {operator} rule
/// cuts it: before a comment start, and without trailing `+`/`-` unless the
/// operator holds a character that SQL operators do not.
fn operator_end(b: &[u8], start: usize) -> usize {
    let mut end = start;
    while end < b.len() && is_op_char(b[end]) {
        end += 1;
    }
    let run = &b[start..end];
    let mut n = run.len();
    if let Some(cut) = run.windows(2).position(|w| w == b"/*" || w == b"--") {
        // Never at 0: the comment would have been skipped before the token.
        n = cut.max(1);
    }
    if n > 1 && matches!(run[n - 1], b'+' | b'-') && !run[..n - 1].iter().any(|c| b"~!@#^&|`?%".contains(c)) {
        while n > 1 && matches!(run[n - 1], b'+' | b'-') {
            n -= 1;
        }
    }
    start + n
}

impl<'a> Lexer<'a> {
    fn new(sql: &'a str, scs: bool) -> Self {
        Self { sql, pos: 0, scs, done: false }
    }

    fn token(&mut self, kind: Kind, start: usize, end: Option<usize>) -> Token<'a> {
        match end {
            Some(end) => {
                self.pos = end;
                Token { kind, text: &self.sql[start..end], start }
            }
            None => {
                self.done = true;
                self.pos = self.sql.len();
                Token { kind: Kind::Unterminated, text: &self.sql[start..], start }
            }
        }
    }

    fn dollar(&mut self, start: usize) -> Token<'a> {
        let b = self.sql.as_bytes();
        let mut i = start + 1;
        if b.get(i).is_some_and(u8::is_ascii_digit) {
            while b.get(i).is_some_and(u8::is_ascii_digit) {
                i += 1;
            }
            if i < b.len() && is_ident_start(b[i]) {
                i = ident_end(b, i); // {param_junk}
            }
            return self.token(Kind::Param, start, Some(i));
        }
        if i < b.len() && is_ident_start(b[i]) {
            while i < b.len() && is_dollar_tag_cont(b[i]) {
                i += 1;
            }
        }
        if b.get(i) != Some(&b'$') {
            // {dolqfailed}: a lone `$`; the tag is lexed again as a word.
            return self.token(Kind::Other, start, Some(start + 1));
        }
        let delimiter = &self.sql[start..=i];
        let body = i + 1;
        let end = self.sql[body..].find(delimiter).map(|n| body + n + delimiter.len());
        self.token(Kind::Str(Quote::Dollar), start, end)
    }
}

impl<'a> Iterator for Lexer<'a> {
    type Item = Token<'a>;

    fn next(&mut self) -> Option<Token<'a>> {
        if self.done {
            return None;
        }
        let b = self.sql.as_bytes();
        loop {
            match b.get(self.pos) {
                None => {
                    self.done = true;
                    return None;
                }
                Some(&c) if is_space(c) => self.pos += 1,
                Some(b'-') if b.get(self.pos + 1) == Some(&b'-') => self.pos = line_end(b, self.pos),
                Some(b'/') if b.get(self.pos + 1) == Some(&b'*') => {
                    let start = self.pos;
                    match block_comment_end(b, start) {
                        Some(end) => self.pos = end,
                        None => return Some(self.token(Kind::Unterminated, start, None)),
                    }
                }
                Some(_) => break,
            }
        }
        let start = self.pos;
        let c = b[start];
        let at = |n: usize| b.get(start + n).copied();
        let standard = if self.scs { Quote::Standard } else { Quote::Escaped };
        let tok = match (c, at(1), at(2)) {
            (b'\'', _, _) => self.token(Kind::Str(standard), start, string_end(b, start, standard)),
            (b'b' | b'B', Some(b'\''), _) => {
                self.token(Kind::Str(Quote::Bit), start, string_end(b, start + 1, Quote::Bit))
            }
            (b'x' | b'X', Some(b'\''), _) => {
                self.token(Kind::Str(Quote::Hex), start, string_end(b, start + 1, Quote::Hex))
            }
            (b'e' | b'E', Some(b'\''), _) => {
                self.token(Kind::Str(Quote::Escaped), start, string_end(b, start + 1, Quote::Escaped))
            }
            // {xnstart}: the NCHAR keyword; the string is lexed next.
            (b'n' | b'N', Some(b'\''), _) => self.token(Kind::Word, start, Some(start + 1)),
            (b'u' | b'U', Some(b'&'), Some(b'\'')) => {
                self.token(Kind::Str(Quote::Unicode), start, string_end(b, start + 2, Quote::Unicode))
            }
            (b'u' | b'U', Some(b'&'), Some(b'"')) => {
                self.token(Kind::UnicodeIdent, start, quoted_ident_end(b, start + 2))
            }
            (b'"', _, _) => self.token(Kind::QuotedIdent, start, quoted_ident_end(b, start)),
            (b'$', _, _) => self.dollar(start),
            (b'0'..=b'9', _, _) => self.token(Kind::Number, start, Some(number_end(b, start))),
            (b'.', Some(b'0'..=b'9'), _) => self.token(Kind::Number, start, Some(number_end(b, start))),
            (c, _, _) if is_ident_start(c) => self.token(Kind::Word, start, Some(ident_end(b, start + 1))),
            (b'.', Some(b'.'), _) | (b':', Some(b':' | b'='), _) => self.token(Kind::Punct, start, Some(start + 2)),
            (b'(' | b')' | b',' | b';' | b'[' | b']' | b'.' | b':', _, _) => {
                self.token(Kind::Punct, start, Some(start + 1))
            }
            (c, _, _) if is_op_char(c) => self.token(Kind::Op, start, Some(operator_end(b, start))),
            _ => self.token(Kind::Other, start, Some(start + 1)),
        };
        Some(tok)
    }
}

// ---------------------------------------------------------------------------
// Literals
// ---------------------------------------------------------------------------

/// The raw contents of the parts of a (complete) quoted string token whose
/// first quote is at byte `open` of `text`.
fn string_parts(text: &str, open: usize, quote: Quote) -> impl Iterator<Item = &str> {
    let b = text.as_bytes();
    let mut next_open = Some(open);
    std::iter::from_fn(move || {
        let open = next_open?;
        let close = part_close(b, open + 1, quote)?;
        next_open = continuation(b, close + 1);
        Some(&text[open + 1..close])
    })
}

fn undouble(raw: &str, out: &mut String) {
    let mut parts = raw.split("''");
    if let Some(first) = parts.next() {
        out.push_str(first);
    }
    for part in parts {
        out.push('\'');
        out.push_str(part);
    }
}

/// A string constant's value, as PostgreSQL decodes it (the server encoding
/// is taken to be UTF-8). `escape` is the `UESCAPE` character of a `U&''`.
fn decode_string(tok: &Token<'_>, quote: Quote, escape: u8) -> Result<String, Unsupported> {
    let text = tok.text;
    match quote {
        Quote::Standard => {
            let mut out = String::with_capacity(text.len());
            string_parts(text, 0, quote).for_each(|raw| undouble(raw, &mut out));
            Ok(out)
        }
        Quote::Escaped => {
            let open = usize::from(!text.starts_with('\''));
            let mut bytes = Vec::with_capacity(text.len());
            for raw in string_parts(text, open, quote) {
                unescape_into(raw.as_bytes(), &mut bytes)?;
            }
            if bytes.contains(&0) {
                return Err(Unsupported::InvalidLiteral);
            }
            String::from_utf8(bytes).map_err(|_| Unsupported::InvalidLiteral)
        }
        Quote::Unicode => {
            let mut raw = String::with_capacity(text.len());
            string_parts(text, 2, quote).for_each(|part| undouble(part, &mut raw));
            let mut out = String::with_capacity(raw.len());
            unicode_unescape(&raw, escape, &mut out)?;
            Ok(out)
        }
        Quote::Dollar => {
            let tag_end = text[1..].find('$').map_or(0, |n| n + 2);
            Ok(text[tag_end..text.len() - tag_end].to_owned())
        }
        Quote::Bit | Quote::Hex => Err(Unsupported::NotALiteral),
    }
}

fn hex_value(digits: &[u8]) -> Option<u32> {
    digits.iter().try_fold(0u32, |acc, &d| Some(acc * 16 + char::from(d).to_digit(16)?))
}

fn push_code_point(c: u32, out: &mut Vec<u8>) -> Result<(), Unsupported> {
    let ch = char::from_u32(c).filter(|&ch| ch != '\0').ok_or(Unsupported::InvalidLiteral)?;
    out.extend_from_slice(ch.encode_utf8(&mut [0; 4]).as_bytes());
    Ok(())
}

/// The escapes of an `E''` part (scan.l's <xe> rules), appended as bytes.
fn unescape_into(raw: &[u8], out: &mut Vec<u8>) -> Result<(), Unsupported> {
    let mut i = 0;
    // A UTF-16 high surrogate waiting for its low half.
    let mut high: Option<u32> = None;
    while i < raw.len() {
        let c = raw[i];
        if high.is_some() && !(c == b'\\' && matches!(raw.get(i + 1), Some(b'u' | b'U'))) {
            return Err(Unsupported::InvalidLiteral);
        }
        if c == b'\'' {
            // `''` inside the part.
            out.push(b'\'');
            i += 2;
            continue;
        }
        if c != b'\\' {
            out.push(c);
            i += 1;
            continue;
        }
        let Some(&e) = raw.get(i + 1) else {
            return Err(Unsupported::InvalidLiteral);
        };
        match e {
            b'0'..=b'7' => {
                let n = raw[i + 1..].iter().take(3).take_while(|d| (b'0'..=b'7').contains(d)).count();
                let value = raw[i + 1..i + 1 + n].iter().fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                out.push((value & 0xff) as u8);
                i += 1 + n;
            }
            b'x' => {
                let n = raw[i + 2..].iter().take(2).take_while(|d| d.is_ascii_hexdigit()).count();
                if n == 0 {
                    out.push(b'x');
                    i += 2;
                } else {
                    out.push(hex_value(&raw[i + 2..i + 2 + n]).unwrap_or(0) as u8);
                    i += 2 + n;
                }
            }
            b'u' | b'U' => {
                let len = if e == b'u' { 4 } else { 8 };
                let digits = raw.get(i + 2..i + 2 + len).filter(|d| d.iter().all(u8::is_ascii_hexdigit));
                let c = digits.and_then(hex_value).ok_or(Unsupported::InvalidLiteral)?;
                i += 2 + len;
                match (high.take(), c) {
                    (None, 0xd800..=0xdbff) => high = Some(c),
                    (None, 0xdc00..=0xdfff) => return Err(Unsupported::InvalidLiteral),
                    (None, c) => push_code_point(c, out)?,
                    (Some(h), 0xdc00..=0xdfff) => push_code_point(0x10000 + ((h - 0xd800) << 10) + (c - 0xdc00), out)?,
                    (Some(_), _) => return Err(Unsupported::InvalidLiteral),
                }
            }
            // PostgreSQL 16 reads `\v` as a vertical tab, 15 as `v`.
            b'v' => return Err(Unsupported::InvalidLiteral),
            _ => {
                out.push(match e {
                    b'b' => 0x08,
                    b'f' => 0x0c,
                    b'n' => b'\n',
                    b'r' => b'\r',
                    b't' => b'\t',
                    other => other,
                });
                i += 2;
            }
        }
    }
    if high.is_some() {
        return Err(Unsupported::InvalidLiteral);
    }
    Ok(())
}

/// Where PostgreSQL's `str_udeescape` writes a `U&` literal: a string, or a
/// bounded buffer for comparing names.
trait Sink {
    fn push(&mut self, c: char);
}

impl Sink for String {
    fn push(&mut self, c: char) {
        String::push(self, c);
    }
}

/// The Unicode escapes of a `U&''` string or `U&""` identifier (parser.c's
/// `str_udeescape`), after `''`/`""` have been undoubled.
fn unicode_unescape(raw: &str, escape: u8, out: &mut impl Sink) -> Result<(), Unsupported> {
    let b = raw.as_bytes();
    let escape_char = char::from(escape);
    let mut high: Option<u32> = None;
    let mut chars = raw.char_indices();
    while let Some((i, ch)) = chars.next() {
        if ch != escape_char {
            if high.is_some() {
                return Err(Unsupported::InvalidLiteral);
            }
            out.push(ch);
            continue;
        }
        let (code, len) = if b.get(i + 1) == Some(&escape) {
            if high.is_some() {
                return Err(Unsupported::InvalidLiteral);
            }
            out.push(escape_char);
            chars.next();
            continue;
        } else if let Some(c) = b.get(i + 1..i + 5).filter(|d| d.iter().all(u8::is_ascii_hexdigit)).and_then(hex_value)
        {
            (c, 4)
        } else if b.get(i + 1) == Some(&b'+')
            && let Some(c) = b.get(i + 2..i + 8).filter(|d| d.iter().all(u8::is_ascii_hexdigit)).and_then(hex_value)
        {
            (c, 7)
        } else {
            return Err(Unsupported::InvalidLiteral);
        };
        for _ in 0..len {
            chars.next();
        }
        if code == 0 || code > 0x10ffff {
            return Err(Unsupported::InvalidLiteral);
        }
        let code = match high.take() {
            Some(h) if (0xdc00..=0xdfff).contains(&code) => 0x10000 + ((h - 0xd800) << 10) + (code - 0xdc00),
            Some(_) => return Err(Unsupported::InvalidLiteral),
            None if (0xd800..=0xdbff).contains(&code) => {
                high = Some(code);
                continue;
            }
            None => code,
        };
        out.push(char::from_u32(code).ok_or(Unsupported::InvalidLiteral)?);
    }
    if high.is_some() {
        return Err(Unsupported::InvalidLiteral);
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Statement shapes
// ---------------------------------------------------------------------------

/// A fencer setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Setting {
    Token,
    Resource,
}

/// A name compared with the fencer settings without allocating: the names
/// are short, so anything longer cannot be one.
#[derive(Debug, Default)]
struct NameBuf {
    bytes: [u8; 16],
    len: usize,
    too_long: bool,
}

impl NameBuf {
    fn push_byte(&mut self, c: u8) {
        match self.bytes.get_mut(self.len) {
            // GUC names compare case-insensitively in ASCII.
            Some(slot) => {
                *slot = c.to_ascii_lowercase();
                self.len += 1;
            }
            None => self.too_long = true,
        }
    }

    fn setting(&self) -> Option<Setting> {
        match (self.too_long, &self.bytes[..self.len]) {
            (false, b"fencer.token") => Some(Setting::Token),
            (false, b"fencer.resource") => Some(Setting::Resource),
            _ => None,
        }
    }
}

impl Sink for NameBuf {
    fn push(&mut self, c: char) {
        c.encode_utf8(&mut [0; 4]).bytes().for_each(|b| self.push_byte(b));
    }
}

/// Tokens with lookahead.
struct Cursor<'a> {
    lexer: Lexer<'a>,
}

impl<'a> Cursor<'a> {
    fn new(text: &'a str, scs: bool) -> Self {
        Self { lexer: Lexer::new(text, scs) }
    }

    fn next(&mut self) -> Option<Token<'a>> {
        self.lexer.next()
    }

    fn peek(&self) -> Option<Token<'a>> {
        self.lexer.clone().next()
    }

    fn peek2(&self) -> Option<Token<'a>> {
        let mut lexer = self.lexer.clone();
        lexer.next();
        lexer.next()
    }

    fn at_end(&self) -> bool {
        self.peek().is_none()
    }

    fn eat_word(&mut self, word: &str) -> bool {
        let hit = self.peek().is_some_and(|t| t.is_word(word));
        if hit {
            self.next();
        }
        hit
    }

    fn eat_punct(&mut self, punct: &str) -> bool {
        let hit = self.peek().is_some_and(|t| t.is_punct(punct));
        if hit {
            self.next();
        }
        hit
    }

    /// After a `U&` token: the `UESCAPE 'c'` clause's character, or `\`.
    /// Consumes the clause. `None` when it is not one PostgreSQL accepts.
    fn uescape(&mut self) -> Option<u8> {
        if !self.eat_word("uescape") {
            return Some(b'\\');
        }
        let tok = self.next()?;
        let Kind::Str(quote @ (Quote::Standard | Quote::Escaped | Quote::Dollar)) = tok.kind else {
            return None;
        };
        let value = decode_string(&tok, quote, b'\\').ok()?;
        match value.as_bytes() {
            &[c] if !(c.is_ascii_hexdigit() || b"+'\"".contains(&c) || is_space(c)) => Some(c),
            _ => None,
        }
    }
}

/// The contents of a `"…"` or `U&"…"` token, `""` undoubled.
fn quoted_ident_raw<'a>(tok: &Token<'a>) -> &'a str {
    let open = if tok.kind == Kind::UnicodeIdent { 3 } else { 1 };
    &tok.text[open..tok.text.len() - 1]
}

/// One part of a `var_name`, appended to `name`. `false` if the next token
/// is not a name part, or is one PostgreSQL rejects.
fn name_part(cursor: &mut Cursor<'_>, name: &mut NameBuf) -> bool {
    let Some(tok) = cursor.peek() else {
        return false;
    };
    match tok.kind {
        Kind::Word => {
            cursor.next();
            tok.text.bytes().for_each(|b| name.push_byte(b));
            true
        }
        Kind::QuotedIdent => {
            cursor.next();
            let raw = quoted_ident_raw(&tok);
            if raw.is_empty() {
                return false;
            }
            // `""` is a quote; both halves compare the same way.
            let mut bytes = raw.bytes().peekable();
            while let Some(b) = bytes.next() {
                name.push_byte(b);
                if b == b'"' {
                    bytes.next();
                }
            }
            true
        }
        Kind::UnicodeIdent => {
            cursor.next();
            let Some(escape) = cursor.uescape() else {
                return false;
            };
            let raw = quoted_ident_raw(&tok).replace("\"\"", "\"");
            !raw.is_empty() && unicode_unescape(&raw, escape, name).is_ok()
        }
        _ => false,
    }
}

/// A `var_name` (`ColId ['.' ColId]…`): which fencer setting it names, if
/// any. `None` also when the tokens are not a name.
fn var_name(cursor: &mut Cursor<'_>) -> Option<Setting> {
    let mut name = NameBuf::default();
    if !name_part(cursor, &mut name) {
        return None;
    }
    while cursor.peek().is_some_and(|t| t.is_punct(".")) {
        cursor.next();
        name.push_byte(b'.');
        if !name_part(cursor, &mut name) {
            return None;
        }
    }
    name.setting()
}

/// Whether any dotted name in `text` is a fencer setting.
fn names_a_setting(text: &str, scs: bool) -> bool {
    let mut cursor = Cursor::new(text, scs);
    while let Some(tok) = cursor.peek() {
        if matches!(tok.kind, Kind::Word | Kind::QuotedIdent | Kind::UnicodeIdent) {
            if var_name(&mut cursor).is_some() {
                return true;
            }
        } else {
            cursor.next();
        }
    }
    false
}

fn classify(keyword: &str, text: &str, scs: bool) -> StatementKind {
    if !matches!(keyword, "SET" | "RESET" | "DISCARD" | "BEGIN" | "START" | "PREPARE" | "COMMIT" | "ROLLBACK" | "COPY")
    {
        return StatementKind::Other;
    }
    let mut cursor = Cursor::new(text, scs);
    cursor.next(); // the keyword
    match keyword {
        "SET" => classify_set(cursor, text, scs),
        "RESET" => classify_reset(cursor, text, scs),
        "DISCARD" if cursor.eat_word("all") && cursor.at_end() => StatementKind::DiscardAll,
        "BEGIN" => {
            let _ = cursor.eat_word("work") || cursor.eat_word("transaction");
            transaction_modes(cursor)
        }
        "START" if cursor.eat_word("transaction") => transaction_modes(cursor),
        "PREPARE" if cursor.eat_word("transaction") => match cursor.peek() {
            // `PREPARE transaction AS …` prepares a statement named "transaction".
            Some(t) if t.is_word("as") || t.is_punct("(") => StatementKind::Other,
            _ => StatementKind::TwoPhase(TwoPhase::PrepareTransaction),
        },
        "COMMIT" if cursor.eat_word("prepared") => StatementKind::TwoPhase(TwoPhase::CommitPrepared),
        "ROLLBACK" if cursor.eat_word("prepared") => StatementKind::TwoPhase(TwoPhase::RollbackPrepared),
        "COPY" => classify_copy(cursor),
        _ => StatementKind::Other,
    }
}

/// What a statement that is not a recognised form of a fencer setting is:
/// refused if it names one anyway, else `Other`.
fn not_a_declaration(text: &str, scs: bool) -> StatementKind {
    if names_a_setting(text, scs) {
        StatementKind::UnsupportedFencerSetting(Unsupported::Malformed)
    } else {
        StatementKind::Other
    }
}

fn classify_set(mut cursor: Cursor<'_>, text: &str, scs: bool) -> StatementKind {
    let mut local = false;
    if let Some(t) = cursor.peek()
        && (t.is_word("session") || t.is_word("local"))
        && !cursor.peek2().is_some_and(|n| n.is_punct("."))
    {
        local = t.is_word("local");
        cursor.next();
    }
    let Some(setting) = var_name(&mut cursor) else {
        return not_a_declaration(text, scs);
    };
    let value = if local { Err(Unsupported::Local) } else { set_value(&mut cursor, scs) };
    match (setting, value) {
        (Setting::Token, Ok(Some(v))) => StatementKind::SetToken(v),
        (Setting::Token, Ok(None)) => StatementKind::ResetToken,
        (Setting::Resource, Ok(Some(v))) => StatementKind::SetResource(v),
        (Setting::Resource, Ok(None)) => StatementKind::ResetResource,
        (_, Err(why)) => StatementKind::UnsupportedFencerSetting(why),
    }
}

/// `{= | TO} <literal | DEFAULT>` and the end of the statement: the value,
/// `None` for `DEFAULT`.
fn set_value(cursor: &mut Cursor<'_>, scs: bool) -> Result<Option<String>, Unsupported> {
    match cursor.next() {
        Some(t) if t.is_op("=") || t.is_word("to") => {}
        Some(t) if t.is_word("from") => return Err(Unsupported::FromCurrent),
        _ => return Err(Unsupported::Malformed),
    }
    let tok = cursor.next().ok_or(Unsupported::Malformed)?;
    let value = match tok.kind {
        Kind::Word if tok.is_word("default") => None,
        Kind::Word
            if tok.is_word("n")
                && cursor.peek().is_some_and(|s| s.start == tok.end() && matches!(s.kind, Kind::Str(_))) =>
        {
            // N'…' (NCHAR) is not a string constant in SET.
            return Err(Unsupported::NotALiteral);
        }
        Kind::Word => {
            if lookup_upper(tok.text, RESERVED_KEYWORDS).is_some_and(|k| !matches!(k, "TRUE" | "FALSE" | "ON")) {
                return Err(Unsupported::NotALiteral);
            }
            if tok.text.len() > MAX_IDENTIFIER_BYTES {
                return Err(Unsupported::InvalidLiteral);
            }
            Some(tok.text.to_ascii_lowercase())
        }
        Kind::Number if tok.text.bytes().all(|b| b.is_ascii_digit()) => Some(integer_text(tok.text)),
        Kind::Str(Quote::Unicode) if !scs => return Err(Unsupported::InvalidLiteral),
        Kind::Str(Quote::Unicode) => {
            let escape = cursor.uescape().ok_or(Unsupported::InvalidLiteral)?;
            Some(decode_string(&tok, Quote::Unicode, escape)?)
        }
        Kind::Str(quote) => Some(decode_string(&tok, quote, b'\\')?),
        Kind::QuotedIdent | Kind::UnicodeIdent => {
            let raw = quoted_ident_raw(&tok).replace("\"\"", "\"");
            let value = if tok.kind == Kind::UnicodeIdent {
                let escape = cursor.uescape().ok_or(Unsupported::InvalidLiteral)?;
                let mut out = String::with_capacity(raw.len());
                unicode_unescape(&raw, escape, &mut out)?;
                out
            } else {
                raw
            };
            if value.is_empty() || value.len() > MAX_IDENTIFIER_BYTES {
                return Err(Unsupported::InvalidLiteral);
            }
            Some(value)
        }
        _ => return Err(Unsupported::NotALiteral),
    };
    match cursor.next() {
        None => Ok(value),
        Some(t) if t.is_punct(",") && value.is_some() => Err(Unsupported::List),
        Some(_) => Err(Unsupported::Malformed),
    }
}

/// How PostgreSQL prints an unsigned integer constant back: an int4 without
/// leading zeros, a larger one (a float constant to the lexer) as written.
fn integer_text(digits: &str) -> String {
    let significant = digits.trim_start_matches('0');
    match significant.parse::<u32>() {
        Ok(n) if n <= i32::MAX as u32 => n.to_string(),
        _ if significant.is_empty() => "0".to_owned(),
        _ => digits.to_owned(),
    }
}

fn classify_reset(mut cursor: Cursor<'_>, text: &str, scs: bool) -> StatementKind {
    if cursor.eat_word("all") {
        return if cursor.at_end() { StatementKind::ResetAll } else { StatementKind::Other };
    }
    match var_name(&mut cursor) {
        Some(Setting::Token) if cursor.at_end() => StatementKind::ResetToken,
        Some(Setting::Resource) if cursor.at_end() => StatementKind::ResetResource,
        Some(_) => StatementKind::UnsupportedFencerSetting(Unsupported::Malformed),
        None => not_a_declaration(text, scs),
    }
}

/// `[transaction_mode [[,] transaction_mode]…]` to the end: `Begin`.
fn transaction_modes(mut cursor: Cursor<'_>) -> StatementKind {
    let mut first = true;
    while !cursor.at_end() {
        if !first && cursor.eat_punct(",") && cursor.at_end() {
            return StatementKind::Other;
        }
        first = false;
        let ok = if cursor.eat_word("isolation") {
            cursor.eat_word("level")
                && (cursor.eat_word("serializable")
                    || (cursor.eat_word("repeatable") && cursor.eat_word("read"))
                    || (cursor.eat_word("read") && (cursor.eat_word("committed") || cursor.eat_word("uncommitted"))))
        } else if cursor.eat_word("read") {
            cursor.eat_word("only") || cursor.eat_word("write")
        } else {
            // [NOT] DEFERRABLE
            let _ = cursor.eat_word("not");
            cursor.eat_word("deferrable")
        };
        if !ok {
            return StatementKind::Other;
        }
    }
    StatementKind::Begin
}

/// `COPY [BINARY] name [(columns)] FROM STDIN …`.
fn classify_copy(mut cursor: Cursor<'_>) -> StatementKind {
    cursor.eat_word("binary");
    let mut name = NameBuf::default();
    if !name_part(&mut cursor, &mut name) {
        return StatementKind::Other; // also `COPY (query) TO …`
    }
    while cursor.eat_punct(".") {
        if !name_part(&mut cursor, &mut name) {
            return StatementKind::Other;
        }
    }
    if cursor.eat_punct("(") {
        let mut depth = 1usize;
        while depth > 0 {
            match cursor.next() {
                None => return StatementKind::Other,
                Some(t) if t.is_punct("(") => depth += 1,
                Some(t) if t.is_punct(")") => depth -= 1,
                Some(_) => {}
            }
        }
    }
    if cursor.eat_word("from") && cursor.eat_word("stdin") {
        StatementKind::CopyFromStdin
    } else {
        StatementKind::Other
    }
}
