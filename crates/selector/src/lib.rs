//! Calico's label-selector language: parse, evaluate, canonicalise, identify,
//! and derive label restrictions.
//!
//! ```
//! use std::collections::BTreeMap;
//! use margay_selector::Selector;
//!
//! let sel: Selector = r#"app == "web" && tier in {"fe", "be"}"#.parse()?;
//! let labels = BTreeMap::from([
//!     ("app".to_owned(), "web".to_owned()),
//!     ("tier".to_owned(), "fe".to_owned()),
//! ]);
//! assert!(sel.matches(&labels));
//! assert_eq!(sel.canonical(), r#"(app == "web" && tier in {"be", "fe"})"#);
//! # Ok::<(), margay_selector::ParseError>(())
//! ```
//!
//! # Design
//!
//! * Parsing is a hand-written, fully iterative lexer/parser (no recursion, so
//!   arbitrarily deep nesting cannot overflow the stack) producing a
//!   short-lived arena AST. It accepts exactly Calico's language, including
//!   its quirks (`startswith`, `notin`, trailing comma in sets, `!` chains
//!   collapsing to their parity).
//! * From the AST we compute, once, the canonical string (Calico's exact
//!   rendering), the UniqueID (`"s:" + base64url_nopad(SHA-224("s:" +
//!   canonical))`), and a compiled decision graph. The AST is then dropped.
//! * Evaluation walks the decision graph: each step looks up one label and
//!   follows the true/false edge. `&&`, `||`, `!` are compiled into the edges,
//!   so evaluation short-circuits, never recurses and never allocates.
//! * [`LabelRestrictions`] are derived on demand from the same graph, for
//!   indexing selectors by the labels they require.
//!
//! See `DESIGN.md` for the invariants.
#![forbid(unsafe_code)]

mod error;
mod parse;
mod program;
mod restrict;

use std::borrow::Borrow;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::hash::{BuildHasher, Hash, Hasher};
use std::str::FromStr;

use base64::Engine as _;
use sha2::{Digest, Sha224};

pub use error::ParseError;
pub use parse::MAX_LABEL_LEN;
pub use restrict::{LabelRestriction, LabelRestrictions};

use program::Program;

/// A set of labels a selector can be evaluated against.
///
/// Implementations must not allocate in `get` if evaluation is to stay
/// allocation-free (all the provided ones don't).
pub trait Labels {
    /// The value of label `key`, or `None` if the label is not present.
    fn get(&self, key: &str) -> Option<&str>;
}

impl<T: Labels + ?Sized> Labels for &T {
    fn get(&self, key: &str) -> Option<&str> {
        (**self).get(key)
    }
}

impl<T: Labels + ?Sized> Labels for Box<T> {
    fn get(&self, key: &str) -> Option<&str> {
        (**self).get(key)
    }
}

impl<K: Borrow<str> + Ord, V: AsRef<str>> Labels for BTreeMap<K, V> {
    fn get(&self, key: &str) -> Option<&str> {
        BTreeMap::get(self, key).map(AsRef::as_ref)
    }
}

impl<K: Borrow<str> + Hash + Eq, V: AsRef<str>, S: BuildHasher> Labels for HashMap<K, V, S> {
    fn get(&self, key: &str) -> Option<&str> {
        HashMap::get(self, key).map(AsRef::as_ref)
    }
}

/// Key/value pairs, searched linearly; the first pair with the key wins.
impl<K: AsRef<str>, V: AsRef<str>> Labels for [(K, V)] {
    fn get(&self, key: &str) -> Option<&str> {
        self.iter()
            .find(|(k, _)| k.as_ref() == key)
            .map(|(_, v)| v.as_ref())
    }
}

impl<K: AsRef<str>, V: AsRef<str>, const N: usize> Labels for [(K, V); N] {
    fn get(&self, key: &str) -> Option<&str> {
        Labels::get(&self[..], key)
    }
}

impl<K: AsRef<str>, V: AsRef<str>> Labels for Vec<(K, V)> {
    fn get(&self, key: &str) -> Option<&str> {
        Labels::get(&self[..], key)
    }
}

/// A parsed selector.
///
/// Equality, ordering and hashing are by canonical form, so two selectors
/// that differ only in whitespace, quoting or set order are equal.
#[derive(Clone)]
pub struct Selector {
    program: Program,
    canonical: Box<str>,
    unique_id: Box<str>,
}

impl Selector {
    /// Parses a selector. The empty (or all-whitespace) string is `all()`.
    pub fn parse(input: &str) -> Result<Selector, ParseError> {
        let ast = parse::parse(input)?;
        let canonical = ast.canonical();
        let program = Program::compile(&ast);
        Ok(Selector::from_parts(program, canonical))
    }

    /// The selector that matches everything (`all()`).
    pub fn all() -> Selector {
        Selector::from_parts(Program::constant(true), "all()".to_owned())
    }

    /// The selector that matches nothing (`!all()`).
    pub fn none() -> Selector {
        Selector::from_parts(Program::constant(false), "!all()".to_owned())
    }

    fn from_parts(program: Program, canonical: String) -> Selector {
        let unique_id = unique_id(&canonical);
        Selector {
            program,
            canonical: canonical.into(),
            unique_id: unique_id.into(),
        }
    }

    /// Whether the labels match. Never allocates (given a `Labels` impl that
    /// doesn't).
    #[inline]
    pub fn matches<L: Labels + ?Sized>(&self, labels: &L) -> bool {
        self.program.matches(labels)
    }

    /// Calico's canonical form, e.g. `(a == "b" && has(c))`.
    pub fn canonical(&self) -> &str {
        &self.canonical
    }

    /// Calico's UniqueID: `"s:" + base64url_nopad(SHA-224("s:" + canonical))`.
    pub fn unique_id(&self) -> &str {
        &self.unique_id
    }

    /// What every matching label set must satisfy.
    ///
    /// Computed on each call (linear in the selector's size) rather than
    /// stored: most selectors never need it, Calico found storing it for every
    /// selector costs significant memory, and a cache would put interior
    /// mutability into a type that is meant to be a map key.
    pub fn restrictions(&self) -> LabelRestrictions {
        restrict::analyse(&self.program)
    }
}

fn unique_id(canonical: &str) -> String {
    let mut hasher = Sha224::new();
    hasher.update(b"s:");
    hasher.update(canonical.as_bytes());
    let digest = hasher.finalize();
    let mut id = String::from("s:");
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode_string(digest, &mut id);
    id
}

/// The canonical form of `input` with `prefix` written before every label name, as Calico
/// does when it turns a namespace selector into a selector on endpoints' `pcns.` labels
/// (and a service-account selector into one on `pcsa.` labels).
pub fn prefix_labels(input: &str, prefix: &str) -> Result<String, ParseError> {
    Ok(parse::parse(input)?.canonical_with_prefix(prefix))
}

/// Checks that `input` is a valid selector.
pub fn validate(input: &str) -> Result<(), ParseError> {
    parse::parse(input).map(|_| ())
}

impl Default for Selector {
    /// `all()`, like Calico's empty selector.
    fn default() -> Self {
        Selector::all()
    }
}

impl FromStr for Selector {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Selector::parse(s)
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.canonical)
    }
}

impl fmt::Debug for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Selector").field(&&*self.canonical).finish()
    }
}

impl PartialEq for Selector {
    fn eq(&self, other: &Self) -> bool {
        self.canonical == other.canonical
    }
}

impl Eq for Selector {}

impl Hash for Selector {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.canonical.hash(state);
    }
}

impl PartialOrd for Selector {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Selector {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.canonical.cmp(&other.canonical)
    }
}
