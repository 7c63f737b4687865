//! Shared test helpers: resources from YAML, driving a graph between datastore states, and a
//! from-scratch computation to compare against.
#![allow(dead_code)]

use std::collections::BTreeMap;

use margay_api::{Resource, ResourceKey, decode_one};
use margay_calc::{CalcConfig, CalcGraph, DataplaneModel, Message, RouteSource};

pub const HOST: &str = "host1";

pub fn res(yaml: &str) -> Resource {
    match decode_one(yaml) {
        Ok(r) => {
            if let Err(e) = r.validate() {
                panic!("test resource does not validate: {e}\n{yaml}");
            }
            r
        }
        Err(e) => panic!("bad test resource: {e}\n{yaml}"),
    }
}

/// A datastore state: resources by key.
pub type State = BTreeMap<ResourceKey, Resource>;

pub fn state(resources: &[Resource]) -> State {
    resources.iter().map(|r| (r.key(), r.clone())).collect()
}

pub fn config() -> CalcConfig {
    CalcConfig {
        hostname: HOST.to_string(),
        route_source: RouteSource::CalicoIpam,
    }
}

/// The order in which a transition's updates are delivered.
#[derive(Debug, Clone, Copy)]
pub enum Order {
    Forwards,
    Backwards,
    /// Deletions first, then the rest backwards.
    DeletesFirst,
    /// Every update preceded by a deletion of the same key (a spurious delete, as after a
    /// resync), flushing in between.
    WithSpuriousDeletes,
}

/// A graph with the model of what it told the dataplane.
pub struct Harness {
    pub graph: CalcGraph,
    pub model: DataplaneModel,
    pub current: State,
    pub messages: usize,
}

impl Harness {
    pub fn new(config: CalcConfig) -> Harness {
        let mut graph = CalcGraph::new(config);
        graph.on_in_sync();
        let mut model = DataplaneModel::default();
        let msgs = graph.flush();
        model.apply_all(&msgs).expect("contract");
        Harness {
            graph,
            model,
            current: State::new(),
            messages: msgs.len(),
        }
    }

    pub fn flush(&mut self) -> Vec<Message> {
        let msgs = self.graph.flush();
        if let Err(e) = self.model.apply_all(&msgs) {
            panic!("dataplane contract broken: {e}\nmessages: {msgs:#?}");
        }
        self.messages += msgs.len();
        msgs
    }

    pub fn apply(&mut self, key: &ResourceKey, value: Option<Resource>) {
        match &value {
            Some(v) => self.current.insert(key.clone(), v.clone()),
            None => self.current.remove(key),
        };
        self.graph.on_update(key, value);
    }

    /// Moves the datastore to `target`, delivering updates in `order`, then flushes.
    pub fn go_to(&mut self, target: &State, order: Order) {
        let mut updates: Vec<(ResourceKey, Option<Resource>)> = Vec::new();
        for (k, v) in target {
            if self.current.get(k) != Some(v) {
                updates.push((k.clone(), Some(v.clone())));
            }
        }
        for k in self.current.keys() {
            if !target.contains_key(k) {
                updates.push((k.clone(), None));
            }
        }
        match order {
            Order::Forwards => {}
            Order::Backwards => updates.reverse(),
            Order::DeletesFirst => {
                updates.reverse();
                updates.sort_by_key(|(_, v)| v.is_some());
            }
            Order::WithSpuriousDeletes => {
                for (k, v) in updates {
                    self.apply(&k, None);
                    self.flush();
                    self.apply(&k, v);
                }
                self.flush();
                return;
            }
        }
        for (k, v) in updates {
            self.apply(&k, v);
        }
        self.flush();
    }
}

/// What a fresh graph computes for a state in one go.
pub fn from_scratch(config: CalcConfig, target: &State) -> DataplaneModel {
    let mut graph = CalcGraph::new(config);
    for (k, v) in target {
        graph.on_update(k, Some(v.clone()));
    }
    graph.on_in_sync();
    let msgs = graph.flush();
    let mut model = DataplaneModel::default();
    if let Err(e) = model.apply_all(&msgs) {
        panic!("dataplane contract broken from scratch: {e}");
    }
    // A second flush with nothing new must say nothing.
    let again = graph.flush();
    assert!(again.is_empty(), "idle flush emitted {again:#?}");
    model
}

/// The IP-set id Calico would give a selector set.
pub fn sel_id(selector: &str) -> String {
    margay_selector::Selector::parse(selector)
        .expect("selector")
        .unique_id()
        .to_string()
}
