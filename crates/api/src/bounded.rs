//! Bounds on what one YAML or JSON input may cost to decode.
//!
//! The YAML parser (libyaml, through serde_norway) reads a whole document into events before
//! anything is built, spends time quadratic in flow nesting doing so, and expands aliases
//! without limit. So a YAML input is first scanned by a streaming parser that stops at a
//! budget (depth, nodes, aliases) in linear time, and the value is then built by a seed that
//! counts every node and scalar byte it creates, failing as soon as alias expansion exceeds
//! what the document itself holds.

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// Deepest nesting of mappings and sequences accepted. serde_norway refuses anything deeper
/// than 128 anyway; a resource needs about 10.
pub const MAX_DEPTH: usize = 100;
/// Most nodes (mappings, sequences, scalars) one input may hold as written: about 16 MiB of
/// dense YAML, far beyond any real set of resources.
pub const MAX_NODES: usize = 2_000_000;
/// Nodes alias expansion may add on top of those written (besides as many again as written).
pub const ALIAS_NODE_ALLOWANCE: usize = 100_000;
/// Scalar bytes alias expansion may add on top of twice the input's length.
pub const ALIAS_BYTE_ALLOWANCE: usize = 1 << 20;

/// Why an input is refused before or while it is built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Exceeded {
    Depth,
    Nodes,
    Aliases,
    /// The scanner refused the text; `at` is the byte offset it reached.
    Syntax {
        message: String,
        at: usize,
    },
}

impl Exceeded {
    pub(crate) fn message(&self) -> String {
        match self {
            Exceeded::Depth => format!(
                "the input nests mappings or sequences more than {MAX_DEPTH} levels deep \
                 (a resource needs about 10); flatten it"
            ),
            Exceeded::Nodes => {
                format!("the input holds more than {MAX_NODES} values; split it into several files")
            }
            Exceeded::Aliases => "YAML aliases (*name) expand to far more than the document \
                 itself holds; write the repeated parts out or use fewer aliases"
                .to_string(),
            Exceeded::Syntax { message, .. } => message.clone(),
        }
    }
}

/// What a YAML input holds as written, as the streaming scan counted it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scanned {
    pub nodes: usize,
}

/// Scans `input` in linear time, refusing deep nesting, too many nodes and alias storms
/// before the YAML parser sees it.
pub(crate) fn precheck_yaml(input: &str) -> Result<Scanned, Exceeded> {
    use serde_saphyr::budget::{BudgetBreach, EnforcingPolicy, check_yaml_budget};
    let mut budget = serde_saphyr::Budget::default();
    budget.max_depth = MAX_DEPTH;
    budget.flow_nesting_limit = MAX_DEPTH;
    budget.max_nodes = MAX_NODES;
    // Events are about nodes plus one per collection end and document; leave room.
    budget.max_events = MAX_NODES.saturating_mul(3);
    budget.max_documents = MAX_NODES;
    budget.max_aliases = MAX_NODES;
    budget.max_anchors = MAX_NODES;
    budget.max_total_scalar_bytes = usize::MAX;
    budget.max_reader_input_bytes = None;
    // Alias expansion is bounded while the value is built (BoundedValue); legitimate files
    // may reuse a few anchors many times.
    budget.enforce_alias_anchor_ratio = false;
    budget.max_merge_keys = MAX_NODES;
    match check_yaml_budget(input, budget, EnforcingPolicy::AllContent) {
        Ok(report) => match report.breached {
            None => Ok(Scanned {
                nodes: report.nodes,
            }),
            Some(BudgetBreach::Depth { .. }) => Err(Exceeded::Depth),
            Some(BudgetBreach::Nodes { .. } | BudgetBreach::Events { .. }) => Err(Exceeded::Nodes),
            Some(_) => Err(Exceeded::Aliases),
        },
        Err(e) => {
            // The parser's own nesting limits (set from the budget) surface as scan errors.
            if matches!(
                e.kind(),
                serde_saphyr::granit_parser::ErrorKind::RecursionLimitExceeded
            ) {
                return Err(Exceeded::Depth);
            }
            let msg = e.to_string();
            let marker = e.marker();
            let at = marker
                .byte_offset()
                .unwrap_or_else(|| char_to_byte(input, marker.index()));
            Err(Exceeded::Syntax { message: msg, at })
        }
    }
}

fn char_to_byte(s: &str, chars: usize) -> usize {
    s.char_indices().nth(chars).map_or(s.len(), |(i, _)| i)
}

/// Counts what building values has cost so far, across the documents of one input.
#[derive(Debug)]
pub(crate) struct Budget {
    nodes_left: usize,
    bytes_left: usize,
    pub exceeded: bool,
}

impl Budget {
    /// Room for what the input holds as written, the same again, and a fixed allowance.
    pub(crate) fn for_input(input_len: usize, scanned: Scanned) -> Budget {
        Budget {
            nodes_left: scanned
                .nodes
                .saturating_mul(2)
                .saturating_add(ALIAS_NODE_ALLOWANCE),
            bytes_left: input_len
                .saturating_mul(2)
                .saturating_add(ALIAS_BYTE_ALLOWANCE),
            exceeded: false,
        }
    }

    fn node<E: serde::de::Error>(&mut self, bytes: usize) -> Result<(), E> {
        match (
            self.nodes_left.checked_sub(1),
            self.bytes_left.checked_sub(bytes),
        ) {
            (Some(n), Some(b)) => {
                self.nodes_left = n;
                self.bytes_left = b;
                Ok(())
            }
            _ => {
                self.exceeded = true;
                Err(E::custom(Exceeded::Aliases.message()))
            }
        }
    }
}

/// Builds a `serde_json::Value` as `Value::deserialize` does, charging every node to a
/// [`Budget`].
pub(crate) struct BoundedValue<'b>(pub &'b mut Budget);

impl<'de> DeserializeSeed<'de> for BoundedValue<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for BoundedValue<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any valid JSON value")
    }

    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Value, E> {
        self.0.node(1)?;
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Value, E> {
        self.0.node(8)?;
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Value, E> {
        self.0.node(8)?;
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Value, E> {
        self.0.node(8)?;
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Value, E> {
        self.0.node(v.len())?;
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Value, E> {
        self.0.node(v.len())?;
        Ok(Value::String(v))
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<Value, E> {
        self.0.node(0)?;
        Ok(Value::Null)
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Value, E> {
        self.0.node(0)?;
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        BoundedValue(self.0).deserialize(d)
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        BoundedValue(self.0).deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        self.0.node(0)?;
        let mut items = Vec::new();
        while let Some(v) = seq.next_element_seed(BoundedValue(&mut *self.0))? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        self.0.node(0)?;
        let mut out = Map::new();
        while let Some(key) = map.next_key_seed(Key(&mut *self.0))? {
            let value = map.next_value_seed(BoundedValue(&mut *self.0))?;
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
}

/// A mapping key, read as a string as `Value::deserialize` reads it (so `1:` is "1").
struct Key<'b>(&'b mut Budget);

impl<'de> DeserializeSeed<'de> for Key<'_> {
    type Value = String;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key<'_> {
    type Value = String;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a string key")
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<String, E> {
        self.0.node(v.len())?;
        Ok(v.to_owned())
    }

    fn visit_string<E: serde::de::Error>(self, v: String) -> Result<String, E> {
        self.0.node(v.len())?;
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn deep_flow_nesting_is_refused_by_the_scan() {
        let deep = "[".repeat(10_000);
        assert_eq!(precheck_yaml(&deep).unwrap_err(), Exceeded::Depth);
        let deep_block: String = (0..200).map(|_| "- ").collect::<String>() + "x\n";
        assert_eq!(precheck_yaml(&deep_block).unwrap_err(), Exceeded::Depth);
    }

    #[test]
    fn ordinary_documents_pass_the_scan() {
        let s = precheck_yaml("a: [1, 2]\nb: {c: d}\n---\nx: &a 1\ny: *a\n").unwrap();
        assert!(s.nodes >= 8, "{s:?}");
    }
}
