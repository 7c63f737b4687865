//! The parse error type.

use std::fmt;

/// Longest slice of the input echoed back in an error message; selectors can
/// be arbitrarily long and the message should stay readable in a log line.
const MAX_SHOWN_INPUT: usize = 256;

/// Why a selector string was rejected.
///
/// Displays on one line, e.g.
/// `invalid selector "a === b": at position 4: expected a string, found "="`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid selector {}: at position {position}: expected {expected}, found {found}",
    Shown(.input)
)]
#[non_exhaustive]
pub struct ParseError {
    /// The complete input that failed to parse.
    pub input: String,
    /// Byte offset into `input` where parsing stopped (always a char boundary;
    /// equal to `input.len()` when the input ended too early).
    pub position: usize,
    /// What the parser would have accepted at `position`.
    pub expected: String,
    /// What it found there instead, e.g. `"="` or `end of input`.
    pub found: String,
}

/// Debug-quotes (so newlines etc. stay on one line) and truncates.
struct Shown<'a>(&'a str);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cut = truncate(self.0, MAX_SHOWN_INPUT);
        if cut.len() < self.0.len() {
            write!(f, "{cut:?}...")
        } else {
            write!(f, "{cut:?}")
        }
    }
}

/// Longest prefix of `s` of at most `max` bytes that ends on a char boundary.
pub(crate) fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}
