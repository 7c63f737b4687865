//! Lexing + parsing into a flat AST, and canonical rendering.
//!
//! Everything here is iterative (explicit stacks, arena-indexed nodes) so that
//! deeply nested input such as 100 000 `(` cannot overflow the stack; Calico
//! puts no limit on nesting, so neither do we.

use crate::error::{ParseError, truncate};

/// Calico's limit on the length of a label name.
pub const MAX_LABEL_LEN: usize = 512;

/// What the parser accepts where an operand starts; used in error messages.
const EXPECTED_OPERAND: &str = r#"a label, "has(", "all()", "global()", "!" or "(""#;
const EXPECTED_OPERATOR: &str =
    "an operator (==, !=, in, not in, contains, starts with, ends with)";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CmpOp {
    Eq,
    Ne,
    Contains,
    StartsWith,
    EndsWith,
}

impl CmpOp {
    fn canonical(self) -> &'static str {
        match self {
            CmpOp::Eq => " == ",
            CmpOp::Ne => " != ",
            CmpOp::Contains => " contains ",
            CmpOp::StartsWith => " starts with ",
            CmpOp::EndsWith => " ends with ",
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) enum Leaf<'a> {
    Has(&'a str),
    Cmp {
        label: &'a str,
        op: CmpOp,
        value: &'a str,
    },
    /// `label in {..}` / `label not in {..}`; `values` sorted and de-duplicated.
    Set {
        label: &'a str,
        negated: bool,
        values: Vec<&'a str>,
    },
}

pub(crate) type NodeId = usize;

#[derive(Debug, Clone)]
pub(crate) enum Node<'a> {
    Leaf(Leaf<'a>),
    All,
    Global,
    Not(NodeId),
    /// Always at least two operands: single-operand groups collapse.
    And(Vec<NodeId>),
    Or(Vec<NodeId>),
}

/// Arena AST. Children are always created before their parents.
#[derive(Debug)]
pub(crate) struct Ast<'a> {
    pub nodes: Vec<Node<'a>>,
    pub root: NodeId,
}

pub(crate) fn is_label_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'/' | b'-')
}

struct Cursor<'a> {
    src: &'a str,
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn rest(&self) -> &'a str {
        // `pos` only ever advances over ASCII or to just past an ASCII quote,
        // so it is always a char boundary; fall back to "" rather than panic.
        self.src.get(self.pos..).unwrap_or("")
    }

    fn peek(&self) -> Option<u8> {
        self.src.as_bytes().get(self.pos).copied()
    }

    fn at_end(&self) -> bool {
        self.pos >= self.src.len()
    }

    /// Calico's whitespace is space and tab only (newlines are rejected).
    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.pos += 1;
        }
    }

    fn eat(&mut self, s: &str) -> bool {
        if self.rest().starts_with(s) {
            self.pos += s.len();
            true
        } else {
            false
        }
    }

    /// Keyword operator, possibly multi-word (`starts with`, also `startswith`).
    /// Must end at a word boundary so `a inx` is not `a in x`.
    fn eat_words(&mut self, words: &[&str]) -> bool {
        let start = self.pos;
        for (i, w) in words.iter().enumerate() {
            if i > 0 {
                self.skip_ws();
            }
            if !self.eat(w) {
                self.pos = start;
                return false;
            }
        }
        if self.peek().is_some_and(is_label_byte) {
            self.pos = start;
            return false;
        }
        true
    }

    fn error_at(&self, position: usize, expected: &str, found: String) -> ParseError {
        ParseError {
            input: self.src.to_owned(),
            position,
            expected: expected.to_owned(),
            found,
        }
    }

    /// Error at the current position, describing whatever token is there.
    fn unexpected(&self, expected: &str) -> ParseError {
        self.error_at(self.pos, expected, describe(self.rest()))
    }

    fn label(&mut self) -> Result<&'a str, ParseError> {
        let start = self.pos;
        let len = self
            .rest()
            .bytes()
            .take_while(|b| is_label_byte(*b))
            .count();
        if len == 0 {
            return Err(self.unexpected("a label"));
        }
        if len > MAX_LABEL_LEN {
            return Err(self.error_at(
                start,
                &format!("a label of at most {MAX_LABEL_LEN} characters"),
                format!("a label of {len} characters"),
            ));
        }
        self.pos += len;
        Ok(&self.src[start..self.pos])
    }

    /// A '…' or "…" literal; no escapes, so it ends at the next matching quote.
    fn string(&mut self, expected: &str) -> Result<&'a str, ParseError> {
        let start = self.pos;
        let quote = match self.peek() {
            Some(q @ (b'"' | b'\'')) => char::from(q),
            _ => return Err(self.unexpected(expected)),
        };
        let body = &self.rest()[1..];
        match body.find(quote) {
            Some(n) => {
                self.pos = start + 1 + n + 1;
                Ok(&body[..n])
            }
            None => Err(self.error_at(
                start,
                &format!("a closing {quote} for the string that starts here"),
                "end of input".to_owned(),
            )),
        }
    }

    fn close_call(&mut self, what: &str) -> Result<(), ParseError> {
        self.skip_ws();
        if self.eat(")") {
            Ok(())
        } else {
            Err(self.unexpected(&format!("\")\" to close \"{what}(\"")))
        }
    }
}

/// Human-readable description of the token at the start of `rest`.
fn describe(rest: &str) -> String {
    const MAX_SHOWN_TOKEN: usize = 64;
    let Some(&first) = rest.as_bytes().first() else {
        return "end of input".to_owned();
    };
    let len = if is_label_byte(first) {
        rest.bytes().take_while(|b| is_label_byte(*b)).count()
    } else if ["==", "!=", "&&", "||"]
        .iter()
        .any(|op| rest.starts_with(op))
    {
        2
    } else if first == b'"' || first == b'\'' {
        rest[1..]
            .find(char::from(first))
            .map_or(rest.len(), |n| n + 2)
    } else {
        rest.chars().next().map_or(1, char::len_utf8)
    };
    let token = &rest[..len];
    let shown = truncate(token, MAX_SHOWN_TOKEN);
    if shown.len() < token.len() {
        format!("{shown:?}...")
    } else {
        format!("{shown:?}")
    }
}

/// One open parenthesis (or the whole input, for the root frame).
#[derive(Default)]
struct Frame {
    /// Completed `&&`-groups of this parenthesis, to be joined by `||`.
    ors: Vec<NodeId>,
    /// Operands of the `&&`-group being built.
    ands: Vec<NodeId>,
    /// An odd number of `!` preceded the `(`.
    negated: bool,
    /// Byte offset of the `(`, for error messages.
    open: usize,
}

fn push<'a>(nodes: &mut Vec<Node<'a>>, node: Node<'a>) -> NodeId {
    nodes.push(node);
    nodes.len() - 1
}

/// Collapses a single-operand group to that operand (as Calico does, so
/// `(a == "b")` renders without parentheses).
fn group<'a>(nodes: &mut Vec<Node<'a>>, ids: Vec<NodeId>, or: bool) -> NodeId {
    if let [only] = ids[..] {
        return only;
    }
    push(nodes, if or { Node::Or(ids) } else { Node::And(ids) })
}

fn close_frame<'a>(nodes: &mut Vec<Node<'a>>, mut frame: Frame) -> NodeId {
    let and = group(nodes, std::mem::take(&mut frame.ands), false);
    frame.ors.push(and);
    let id = group(nodes, frame.ors, true);
    if frame.negated {
        push(nodes, Node::Not(id))
    } else {
        id
    }
}

/// Parses the whole input. Grammar (Calico's):
/// `sel := "" | or;  or := and ("||" and)*;  and := op ("&&" op)*;
///  op := "!"* (has(l) | all() | global() | l cmp STR | l [not] in SET | "(" or ")")`.
pub(crate) fn parse(input: &str) -> Result<Ast<'_>, ParseError> {
    let mut c = Cursor { src: input, pos: 0 };
    let mut nodes = Vec::new();
    c.skip_ws();
    if c.at_end() {
        // Empty (or all-whitespace) selector means all().
        nodes.push(Node::All);
        return Ok(Ast { nodes, root: 0 });
    }
    let mut root = Frame::default();
    let mut open: Vec<Frame> = Vec::new();

    'operand: loop {
        // Any run of `!` collapses to its parity, as in Calico.
        let mut negated = false;
        loop {
            c.skip_ws();
            let rest = c.rest();
            if rest.starts_with('!') && !rest.starts_with("!=") {
                c.pos += 1;
                negated = !negated;
            } else {
                break;
            }
        }
        if c.eat("(") {
            open.push(Frame {
                negated,
                open: c.pos - 1,
                ..Frame::default()
            });
            continue 'operand;
        }
        let mut id = push(&mut nodes, operand(&mut c)?);
        if negated {
            id = push(&mut nodes, Node::Not(id));
        }
        open.last_mut().unwrap_or(&mut root).ands.push(id);

        // After an operand: `&&`, `||`, `)` or the end.
        loop {
            c.skip_ws();
            if c.eat("&&") {
                continue 'operand;
            }
            if c.eat("||") {
                let frame = open.last_mut().unwrap_or(&mut root);
                let and = group(&mut nodes, std::mem::take(&mut frame.ands), false);
                frame.ors.push(and);
                continue 'operand;
            }
            match open.pop() {
                Some(frame) if c.eat(")") => {
                    let id = close_frame(&mut nodes, frame);
                    open.last_mut().unwrap_or(&mut root).ands.push(id);
                }
                Some(frame) => {
                    return Err(c.unexpected(&format!(
                        r#""&&", "||" or ")" (to close the "(" at position {})"#,
                        frame.open
                    )));
                }
                None if c.at_end() => {
                    let root = close_frame(&mut nodes, root);
                    return Ok(Ast { nodes, root });
                }
                None => return Err(c.unexpected(r#""&&", "||" or end of input"#)),
            }
        }
    }
}

/// Parses one non-parenthesised, non-negated operand.
fn operand<'a>(c: &mut Cursor<'a>) -> Result<Node<'a>, ParseError> {
    // `has(`, `all(`, `global(` must be written without a space before `(`;
    // otherwise the word is a label (Calico allows labels named e.g. `all`).
    if c.eat("has(") {
        c.skip_ws();
        let label = c.label()?;
        c.close_call("has")?;
        return Ok(Node::Leaf(Leaf::Has(label)));
    }
    if c.eat("all(") {
        c.close_call("all")?;
        return Ok(Node::All);
    }
    if c.eat("global(") {
        c.close_call("global")?;
        return Ok(Node::Global);
    }
    if !c.peek().is_some_and(is_label_byte) {
        return Err(c.unexpected(EXPECTED_OPERAND));
    }
    let label = c.label()?;
    c.skip_ws();
    let op = if c.eat("==") {
        CmpOp::Eq
    } else if c.eat("!=") {
        CmpOp::Ne
    } else if c.eat_words(&["contains"]) {
        CmpOp::Contains
    } else if c.eat_words(&["starts", "with"]) {
        CmpOp::StartsWith
    } else if c.eat_words(&["ends", "with"]) {
        CmpOp::EndsWith
    } else if c.eat_words(&["not", "in"]) {
        return set(c, label, true);
    } else if c.eat_words(&["in"]) {
        return set(c, label, false);
    } else {
        return Err(c.unexpected(EXPECTED_OPERATOR));
    };
    c.skip_ws();
    let value = c.string("a string")?;
    Ok(Node::Leaf(Leaf::Cmp { label, op, value }))
}

/// `{ STR, STR, ... }`; Calico accepts `{}` and a trailing comma.
fn set<'a>(c: &mut Cursor<'a>, label: &'a str, negated: bool) -> Result<Node<'a>, ParseError> {
    c.skip_ws();
    if !c.eat("{") {
        return Err(c.unexpected("\"{\""));
    }
    let mut values = Vec::new();
    let mut expected = r#"a string or "}""#;
    loop {
        c.skip_ws();
        if !matches!(c.peek(), Some(b'"' | b'\'')) {
            break;
        }
        values.push(c.string("a string")?);
        c.skip_ws();
        if !c.eat(",") {
            expected = r#""," or "}""#;
            break;
        }
    }
    if !c.eat("}") {
        return Err(c.unexpected(expected));
    }
    values.sort_unstable();
    values.dedup();
    Ok(Node::Leaf(Leaf::Set {
        label,
        negated,
        values,
    }))
}

fn push_quoted(out: &mut String, value: &str) {
    // A literal cannot contain its own quote character (there are no escapes),
    // so this choice always re-parses to the same value.
    let quote = if value.contains('"') { '\'' } else { '"' };
    out.push(quote);
    out.push_str(value);
    out.push(quote);
}

impl Ast<'_> {
    /// Calico's canonical string: `&&`/`||` groups parenthesised, single
    /// spaces, `!x`, values double-quoted unless they contain `"`.
    pub(crate) fn canonical(&self) -> String {
        self.canonical_with_prefix("")
    }

    /// The canonical string with `prefix` written before every label name.
    pub(crate) fn canonical_with_prefix(&self, prefix: &str) -> String {
        enum Item {
            Node(NodeId),
            Text(&'static str),
        }
        let mut out = String::new();
        let mut stack = vec![Item::Node(self.root)];
        while let Some(item) = stack.pop() {
            let id = match item {
                Item::Text(s) => {
                    out.push_str(s);
                    continue;
                }
                Item::Node(id) => id,
            };
            match &self.nodes[id] {
                Node::All => out.push_str("all()"),
                Node::Global => out.push_str("global()"),
                Node::Not(child) => {
                    out.push('!');
                    stack.push(Item::Node(*child));
                }
                Node::And(ids) | Node::Or(ids) => {
                    let sep = if matches!(self.nodes[id], Node::And(_)) {
                        " && "
                    } else {
                        " || "
                    };
                    out.push('(');
                    stack.push(Item::Text(")"));
                    for (i, child) in ids.iter().enumerate().rev() {
                        stack.push(Item::Node(*child));
                        if i > 0 {
                            stack.push(Item::Text(sep));
                        }
                    }
                }
                Node::Leaf(Leaf::Has(label)) => {
                    out.push_str("has(");
                    out.push_str(prefix);
                    out.push_str(label);
                    out.push(')');
                }
                Node::Leaf(Leaf::Cmp { label, op, value }) => {
                    out.push_str(prefix);
                    out.push_str(label);
                    out.push_str(op.canonical());
                    push_quoted(&mut out, value);
                }
                Node::Leaf(Leaf::Set {
                    label,
                    negated,
                    values,
                }) => {
                    out.push_str(prefix);
                    out.push_str(label);
                    out.push_str(if *negated { " not in {" } else { " in {" });
                    for (i, v) in values.iter().enumerate() {
                        if i > 0 {
                            out.push_str(", ");
                        }
                        push_quoted(&mut out, v);
                    }
                    out.push('}');
                }
            }
        }
        out
    }
}
