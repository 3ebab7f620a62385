//! The startup packet's `options` parameter, read as PostgreSQL reads it
//! (DESIGN §4a G2: `options=-c fencer.token=N`, libpq's `PGOPTIONS`).
//!
//! The server splits the text like `pg_split_opts` (postinit.c): arguments
//! are separated by whitespace, and a backslash makes the next character
//! literal (`\ ` is a space, `\\` a backslash). It then reads them with
//! getopt over its own switches (`process_postgres_switches` in postgres.c,
//! `B:bC:c:D:d:EeFf:h:ijk:lN:nOPp:r:S:sTt:v:W:-:`): `-c name=value`,
//! `-cname=value` and `--name=value` set a configuration parameter; the
//! other switches set server parameters or nothing and are skipped here with
//! their argument. A switch the server does not know, a missing argument, a
//! word that is not a switch, or a `-c` without `=` makes the server refuse
//! the connection, and [`settings`] an error.
//!
//! Names are returned as the server compares them: `-` becomes `_`
//! (`ParseLongOption`) and ASCII letters are lower-cased. Values are verbatim
//! after unescaping. Settings come in order; the last one of a name wins,
//! and startup-packet parameters named like a setting (`fencer.token` as
//! its own parameter) are applied after all of them.

use thiserror::Error;

/// The longest `options` value accepted: a PostgreSQL startup packet is at
/// most 10,000 bytes (`MAX_STARTUP_PACKET_LENGTH`), so no longer value can
/// reach the server.
pub(crate) const MAX_OPTIONS_BYTES: usize = 10_000;

/// How much of an offending argument an error message repeats.
const SHOWN_BYTES: usize = 64;

/// Why the `options` text is refused; PostgreSQL refuses the connection for
/// each of these too.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub(crate) enum OptionsError {
    /// Longer than [`MAX_OPTIONS_BYTES`].
    #[error(
        "the startup parameter \"options\" is {len} bytes; a PostgreSQL startup packet holds at most {MAX_OPTIONS_BYTES}"
    )]
    TooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// `-c name` or `--name` without `=value`.
    #[error("\"options\": {switch}{name} requires a value: write {switch}name=value")]
    MissingValue {
        /// `-c ` or `--`.
        switch: &'static str,
        /// The argument (at most 64 bytes of it).
        name: String,
    },
    /// A switch that takes an argument ends the text.
    #[error("\"options\": the switch -{0} requires an argument")]
    MissingArgument(char),
    /// A switch PostgreSQL does not know, a word that is not a switch, or
    /// anything after `--`.
    #[error("\"options\": invalid command-line argument for the server: {0}")]
    InvalidArgument(String),
}

/// Every `-c`/`--` setting in `options`, in order: (name lower-cased with
/// `-` as `_`, value verbatim).
pub(crate) fn settings(options: &str) -> Result<Vec<(String, String)>, OptionsError> {
    if options.len() > MAX_OPTIONS_BYTES {
        return Err(OptionsError::TooLong { len: options.len() });
    }
    let args = split(options);
    let mut out = Vec::new();
    let mut next = 0;
    while let Some(arg) = args.get(next) {
        next += 1;
        if arg == "--" {
            // The end of the switches: nothing may follow.
            return match args.get(next) {
                Some(extra) => Err(OptionsError::InvalidArgument(shown(extra))),
                None => Ok(out),
            };
        }
        let bytes = arg.as_bytes();
        if bytes.len() < 2 || bytes[0] != b'-' {
            return Err(OptionsError::InvalidArgument(shown(arg)));
        }
        // Switches may be grouped (`-ec name=value`); one that takes an
        // argument takes the rest of the word, or the next word.
        for (at, &flag) in bytes.iter().enumerate().skip(1) {
            match switch(flag) {
                None => return Err(OptionsError::InvalidArgument(shown(arg))),
                Some(Switch::Flag) => {}
                Some(Switch::WithArgument) => {
                    let value = if at + 1 < bytes.len() {
                        &arg[at + 1..]
                    } else {
                        let value = args.get(next).ok_or(OptionsError::MissingArgument(char::from(flag)))?;
                        next += 1;
                        value.as_str()
                    };
                    if flag == b'c' || flag == b'-' {
                        out.push(long_option(flag, value)?);
                    }
                    break;
                }
            }
        }
    }
    Ok(out)
}

enum Switch {
    Flag,
    WithArgument,
}

/// The server's switches (`process_postgres_switches`).
fn switch(flag: u8) -> Option<Switch> {
    match flag {
        b'B' | b'C' | b'c' | b'D' | b'd' | b'f' | b'h' | b'k' | b'N' | b'p' | b'r' | b'S' | b't' | b'v' | b'W'
        | b'-' => Some(Switch::WithArgument),
        b'b' | b'E' | b'e' | b'F' | b'i' | b'j' | b'l' | b'n' | b'O' | b'P' | b's' | b'T' => Some(Switch::Flag),
        _ => None,
    }
}

/// `name=value` (`ParseLongOption`).
fn long_option(flag: u8, arg: &str) -> Result<(String, String), OptionsError> {
    let Some((name, value)) = arg.split_once('=') else {
        let switch = if flag == b'c' { "-c " } else { "--" };
        return Err(OptionsError::MissingValue { switch, name: shown(arg) });
    };
    Ok((ascii_fold(name), value.to_owned()))
}

/// `name` with ASCII letters lower-cased and `-` as `_`.
fn ascii_fold(name: &str) -> String {
    name.chars().map(|c| if c == '-' { '_' } else { c.to_ascii_lowercase() }).collect()
}

/// The arguments of `options` (`pg_split_opts`).
fn split(options: &str) -> Vec<String> {
    let mut args = Vec::new();
    let mut chars = options.chars().peekable();
    loop {
        while chars.next_if(|&c| is_space(c)).is_some() {}
        if chars.peek().is_none() {
            return args;
        }
        let mut arg = String::new();
        while let Some(c) = chars.next_if(|&c| !is_space(c)) {
            if c == '\\' {
                // The next character, whatever it is; a final `\` is dropped.
                if let Some(escaped) = chars.next() {
                    arg.push(escaped);
                }
            } else {
                arg.push(c);
            }
        }
        args.push(arg);
    }
}

/// C's `isspace` in the C locale.
fn is_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\x0b' | '\x0c' | '\r')
}

/// At most [`SHOWN_BYTES`] of `arg`, for an error message.
fn shown(arg: &str) -> String {
    if arg.len() <= SHOWN_BYTES {
        return arg.to_owned();
    }
    let mut end = SHOWN_BYTES;
    while !arg.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &arg[..end])
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn ok(options: &str) -> Vec<(String, String)> {
        settings(options).unwrap_or_else(|e| panic!("{options:?}: {e}"))
    }

    fn pair(name: &str, value: &str) -> (String, String) {
        (name.to_owned(), value.to_owned())
    }

    #[test]
    fn the_three_spellings_of_a_setting() {
        assert_eq!(ok("-c fencer.token=5"), [pair("fencer.token", "5")]);
        assert_eq!(ok("-cfencer.token=6"), [pair("fencer.token", "6")]);
        assert_eq!(ok("--fencer.token=7"), [pair("fencer.token", "7")]);
    }

    #[test]
    fn names_compare_as_the_server_compares_them() {
        assert_eq!(ok("-c FENCER.Token=1"), [pair("fencer.token", "1")]);
        // ParseLongOption turns dashes into underscores.
        assert_eq!(ok("--fencer-x.to-ken=1"), [pair("fencer_x.to_ken", "1")]);
        assert_eq!(ok("-c ---x=1"), [pair("___x", "1")]);
        assert_eq!(ok("-c Ärger=1"), [pair("Ärger", "1")]);
    }

    #[test]
    fn values_are_verbatim_after_unescaping() {
        assert_eq!(ok(r"-c fencer.token=a\ b\\c"), [pair("fencer.token", r"a b\c")]);
        assert_eq!(ok("-c fencer.token=="), [pair("fencer.token", "=")]);
        assert_eq!(ok("-c fencer.token="), [pair("fencer.token", "")]);
        assert_eq!(ok("-c fencer.token=V1.Ab_-x"), [pair("fencer.token", "V1.Ab_-x")]);
        // A final backslash is dropped, as pg_split_opts drops it.
        assert_eq!(ok(r"-c fencer.token=14\"), [pair("fencer.token", "14")]);
        assert_eq!(ok(r"-c\ fencer.token=1"), [pair(" fencer.token", "1")]);
    }

    #[test]
    fn every_setting_comes_in_order() {
        assert_eq!(
            ok(" \t-c a=1\n--b=2 -c\x0bfencer.token=3 -cFENCER.TOKEN=4 "),
            [pair("a", "1"), pair("b", "2"), pair("fencer.token", "3"), pair("fencer.token", "4")]
        );
        assert_eq!(ok(""), []);
        assert_eq!(ok("   "), []);
    }

    #[test]
    fn other_switches_are_skipped_with_their_argument() {
        // -D takes the next word, so this -c is its argument, not a setting.
        assert_eq!(ok("-D -cfencer.token=1"), []);
        assert_eq!(ok("-B 100 -e -F -d 1 -c fencer.token=2"), [pair("fencer.token", "2")]);
        // Grouped: -e then -c with the next word.
        assert_eq!(ok("-ec fencer.token=8"), [pair("fencer.token", "8")]);
        assert_eq!(ok("-ecfencer.token=9"), [pair("fencer.token", "9")]);
        assert_eq!(ok("-Sc"), []);
        assert_eq!(ok("-c fencer.token=12 --"), [pair("fencer.token", "12")]);
    }

    #[test]
    fn what_the_server_refuses_is_an_error() {
        let missing = settings("-c fencer.token").unwrap_err();
        assert_eq!(missing, OptionsError::MissingValue { switch: "-c ", name: "fencer.token".into() });
        assert!(missing.to_string().contains("-c fencer.token requires a value: write -c name=value"), "{missing}");
        assert_eq!(
            settings("--fencer.token"),
            Err(OptionsError::MissingValue { switch: "--", name: "fencer.token".into() })
        );
        assert_eq!(settings("-c"), Err(OptionsError::MissingArgument('c')));
        assert_eq!(settings("-x"), Err(OptionsError::InvalidArgument("-x".into())));
        assert_eq!(settings("-ex"), Err(OptionsError::InvalidArgument("-ex".into())));
        assert_eq!(settings("foo -c a=1"), Err(OptionsError::InvalidArgument("foo".into())));
        assert_eq!(settings("-c a=1 -"), Err(OptionsError::InvalidArgument("-".into())));
        assert_eq!(settings("-- -c a=1"), Err(OptionsError::InvalidArgument("-c".into())));
        assert_eq!(settings("-é"), Err(OptionsError::InvalidArgument("-é".into())));
    }

    #[test]
    fn the_input_is_bounded() {
        let at_limit = format!("-c fencer.token={}", "1".repeat(MAX_OPTIONS_BYTES - 16));
        assert_eq!(at_limit.len(), MAX_OPTIONS_BYTES);
        assert_eq!(ok(&at_limit).len(), 1);
        let over = format!("{at_limit}1");
        let err = settings(&over).unwrap_err();
        assert_eq!(err, OptionsError::TooLong { len: MAX_OPTIONS_BYTES + 1 });
        assert!(err.to_string().contains("10000"), "{err}");
    }

    #[test]
    fn error_messages_repeat_a_bounded_part_of_the_argument() {
        let long = format!("x{}", "é".repeat(100));
        let Err(OptionsError::InvalidArgument(shown)) = settings(&long) else {
            panic!("a word that is not a switch is refused");
        };
        assert!(shown.len() <= SHOWN_BYTES + '…'.len_utf8(), "{shown}");
        assert!(shown.ends_with('…'));
    }

    /// Writes `value` so that pg_split_opts gives it back.
    fn escape(value: &str) -> String {
        value.chars().flat_map(|c| if is_space(c) || c == '\\' { vec!['\\', c] } else { vec![c] }).collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn rendered_settings_read_back(
            pairs in proptest::collection::vec(("[a-z_][a-z0-9_.]{0,12}", "[ -~\t\n\\\\é]{0,16}"), 0..6),
            spelling in proptest::collection::vec(0..3u8, 6),
        ) {
            let text: Vec<String> = pairs.iter().zip(&spelling).map(|((n, v), s)| match s {
                0 => format!("-c {n}={}", escape(v)),
                1 => format!("-c{n}={}", escape(v)),
                _ => format!("--{n}={}", escape(v)),
            }).collect();
            let got = settings(&text.join(" \t ")).unwrap();
            prop_assert_eq!(got, pairs);
        }

        #[test]
        fn never_panics(text in "[ -~\t\n\x0b\\\\é]{0,80}") {
            if let Ok(found) = settings(&text) {
                for (name, _) in found {
                    prop_assert!(!name.contains('-'), "{name}");
                    prop_assert!(!name.bytes().any(|b| b.is_ascii_uppercase()), "{name}");
                }
            }
        }
    }
}
