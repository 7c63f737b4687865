//! The compiled form used for evaluation: a decision graph of label tests.
//!
//! Each instruction tests one label and names the next instruction for each
//! outcome, or one of the two terminals. `&&`, `||` and `!` disappear at
//! compile time: they only decide where the edges point (`!` swaps them), so
//! evaluation is a loop with no recursion, no stack and no allocation, and it
//! short-circuits exactly like the tree would. Edges always point forward,
//! so the loop terminates.

use crate::Labels;
use crate::parse::{Ast, CmpOp, Leaf, Node, NodeId};

/// Terminal target: the selector matches.
pub(crate) const ACCEPT: usize = usize::MAX;
/// Terminal target: the selector does not match.
pub(crate) const REJECT: usize = usize::MAX - 1;

/// What an instruction checks about its label's value. Every test is false
/// when the label is missing; `!=` and `not in` are the negations of `==` and
/// `in` (Calico: a missing label makes them true), expressed by swapped edges.
#[derive(Debug, Clone)]
pub(crate) enum Test {
    Has,
    Eq(Box<str>),
    /// Sorted, de-duplicated (binary search).
    In(Box<[Box<str>]>),
    Contains(Box<str>),
    StartsWith(Box<str>),
    EndsWith(Box<str>),
}

#[derive(Debug, Clone)]
pub(crate) struct Instr {
    pub label: Box<str>,
    pub test: Test,
    pub on_true: usize,
    pub on_false: usize,
}

impl Instr {
    #[inline(always)]
    fn eval<L: Labels + ?Sized>(&self, labels: &L) -> bool {
        let Some(value) = labels.get(&self.label) else {
            return false;
        };
        match &self.test {
            Test::Has => true,
            Test::Eq(v) => value == &**v,
            // Small sets (the common case) are faster to scan: `==` rejects
            // on length before touching bytes.
            Test::In(set) if set.len() <= 8 => set.iter().any(|e| **e == *value),
            Test::In(set) => set.binary_search_by(|e| (**e).cmp(value)).is_ok(),
            Test::Contains(v) => value.contains(&**v),
            Test::StartsWith(v) => value.starts_with(&**v),
            Test::EndsWith(v) => value.ends_with(&**v),
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Program {
    pub instrs: Box<[Instr]>,
    /// First instruction, or a terminal for constant selectors.
    pub entry: usize,
}

impl Program {
    pub(crate) fn constant(matches: bool) -> Program {
        Program {
            instrs: Box::new([]),
            entry: if matches { ACCEPT } else { REJECT },
        }
    }

    #[inline]
    pub(crate) fn matches<L: Labels + ?Sized>(&self, labels: &L) -> bool {
        let mut pc = self.entry;
        while let Some(instr) = self.instrs.get(pc) {
            pc = if instr.eval(labels) {
                instr.on_true
            } else {
                instr.on_false
            };
        }
        pc == ACCEPT
    }

    /// Compiles right-to-left: a node is compiled knowing where control goes
    /// on true and on false, and yields its entry point. For `a && b`, `b` is
    /// compiled first, then `a` with on-true = entry of `b`. That right-to-left
    /// order also makes every edge point to an earlier-emitted instruction,
    /// which we reverse at the end so edges point forward.
    pub(crate) fn compile(ast: &Ast<'_>) -> Program {
        /// A jump target: fixed, or "the entry of whatever compiled last".
        #[derive(Clone, Copy)]
        enum Target {
            Fixed(usize),
            Last,
        }
        struct Task {
            node: NodeId,
            on_true: Target,
            on_false: Target,
        }

        let mut emitted: Vec<Instr> = Vec::new();
        // Entry of the most recently completed subtree. Because siblings are
        // popped right-to-left and a subtree's entry is its leftmost part
        // (compiled last), this single register is enough — no recursion.
        let mut last = ACCEPT;
        let mut stack = vec![Task {
            node: ast.root,
            on_true: Target::Fixed(ACCEPT),
            on_false: Target::Fixed(REJECT),
        }];
        while let Some(task) = stack.pop() {
            let resolve = |t: Target| match t {
                Target::Fixed(t) => t,
                Target::Last => last,
            };
            let (on_true, on_false) = (resolve(task.on_true), resolve(task.on_false));
            match &ast.nodes[task.node] {
                Node::All | Node::Global => last = on_true,
                Node::Not(child) => stack.push(Task {
                    node: *child,
                    on_true: Target::Fixed(on_false),
                    on_false: Target::Fixed(on_true),
                }),
                Node::And(children) => {
                    let n = children.len();
                    for (i, child) in children.iter().enumerate() {
                        stack.push(Task {
                            node: *child,
                            on_true: if i + 1 == n {
                                Target::Fixed(on_true)
                            } else {
                                Target::Last
                            },
                            on_false: Target::Fixed(on_false),
                        });
                    }
                }
                Node::Or(children) => {
                    let n = children.len();
                    for (i, child) in children.iter().enumerate() {
                        stack.push(Task {
                            node: *child,
                            on_true: Target::Fixed(on_true),
                            on_false: if i + 1 == n {
                                Target::Fixed(on_false)
                            } else {
                                Target::Last
                            },
                        });
                    }
                }
                Node::Leaf(leaf) => {
                    let (label, test, negated) = lower(leaf);
                    let (on_true, on_false) = if negated {
                        (on_false, on_true)
                    } else {
                        (on_true, on_false)
                    };
                    if on_true == on_false {
                        // Tests have no side effects, so an irrelevant test
                        // (e.g. in `a == "x" || all()`) is dropped.
                        last = on_true;
                    } else {
                        emitted.push(Instr {
                            label: label.into(),
                            test,
                            on_true,
                            on_false,
                        });
                        last = emitted.len() - 1;
                    }
                }
            }
        }
        reachable_forward(emitted, last)
    }
}

/// Maps a leaf to (label, positive test, whether to negate).
fn lower<'a>(leaf: &Leaf<'a>) -> (&'a str, Test, bool) {
    match leaf {
        Leaf::Has(label) => (label, Test::Has, false),
        Leaf::Cmp { label, op, value } => {
            let v: Box<str> = (*value).into();
            match op {
                CmpOp::Eq => (label, Test::Eq(v), false),
                CmpOp::Ne => (label, Test::Eq(v), true),
                CmpOp::Contains => (label, Test::Contains(v), false),
                CmpOp::StartsWith => (label, Test::StartsWith(v), false),
                CmpOp::EndsWith => (label, Test::EndsWith(v), false),
            }
        }
        Leaf::Set {
            label,
            negated,
            values,
        } => {
            let set = values.iter().map(|v| Box::<str>::from(*v)).collect();
            (label, Test::In(set), *negated)
        }
    }
}

/// Drops instructions unreachable from `entry` (e.g. the right side of
/// `all() || a == "b"`) and renumbers so that edges point forward and the
/// entry is instruction 0.
fn reachable_forward(emitted: Vec<Instr>, entry: usize) -> Program {
    let n = emitted.len();
    let mut reachable = vec![false; n];
    if entry < n {
        reachable[entry] = true;
    }
    // Edges point to lower indices here, so one descending pass suffices.
    for i in (0..n).rev() {
        if reachable[i] {
            for t in [emitted[i].on_true, emitted[i].on_false] {
                if t < n {
                    reachable[t] = true;
                }
            }
        }
    }
    let mut new_index = vec![REJECT; n];
    let mut next = 0;
    for i in (0..n).rev() {
        if reachable[i] {
            new_index[i] = next;
            next += 1;
        }
    }
    let remap = |t: usize| if t < n { new_index[t] } else { t };
    let instrs = emitted
        .into_iter()
        .enumerate()
        .rev()
        .filter(|(i, _)| reachable[*i])
        .map(|(_, mut instr)| {
            instr.on_true = remap(instr.on_true);
            instr.on_false = remap(instr.on_false);
            instr
        })
        .collect();
    Program {
        instrs,
        entry: remap(entry),
    }
}
