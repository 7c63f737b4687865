//! Property: for random sequences of updates, what the graph told the dataplane equals what a
//! fresh graph computes from the final state (no leaks, no stale state, no hysteresis).
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use margay_api::Resource;
use proptest::prelude::*;

const LABELS: [&str; 6] = [
    "app: a",
    "app: b",
    "app: a, role: db",
    "role: db",
    "role: web, tier: fe",
    "",
];

const SELECTORS: [&str; 6] = [
    "app == 'a'",
    "role == 'db'",
    "has(app)",
    "all()",
    "app in {'a', 'b'} && !has(tier)",
    "pcns.env == 'prod'",
];

/// A resource for `slot` in `variant` (0 = deleted).
fn resource(slot: usize, variant: usize) -> Option<Resource> {
    if variant == 0 {
        return None;
    }
    let v = variant - 1;
    let labels = LABELS[v % LABELS.len()];
    let sel = SELECTORS[v % SELECTORS.len()];
    let sel2 = SELECTORS[(v + 2) % SELECTORS.len()];
    let yaml = match slot {
        0..=5 => {
            let node = if slot.is_multiple_of(3) {
                "host2"
            } else {
                HOST
            };
            let ns = if slot.is_multiple_of(2) { "ns1" } else { "ns2" };
            let ip = format!("192.168.{}.{}", slot, 10 + v % 3);
            let profiles = if v % 4 == 3 {
                format!("[kns.{ns}, missing]")
            } else {
                format!("[kns.{ns}]")
            };
            format!(
                "apiVersion: projectcalico.org/v3
kind: WorkloadEndpoint
metadata:
  name: {node}-k8s-p{slot}-eth0
  namespace: {ns}
  labels: {{{labels}}}
spec:
  orchestrator: k8s
  node: {node}
  pod: p{slot}
  endpoint: eth0
  interfaceName: cali{slot}
  ipNetworks: [{ip}]
  profiles: {profiles}
  ports: [{{name: http, protocol: TCP, port: {}}}]",
                8000 + v
            )
        }
        6 | 7 => format!(
            "apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {{name: gnp{slot}}}
spec:
  order: {}
  tier: {}
  selector: {sel:?}
  ingress: [{{action: Allow, source: {{selector: {sel2:?}}}}}]
  egress: [{{action: Deny, protocol: TCP, destination: {{selector: {sel:?}, ports: [http, 80]}}}}]",
            v % 3,
            if v.is_multiple_of(2) { "default" } else { "t1" }
        ),
        8 => format!(
            "apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata: {{name: np, namespace: ns1}}
spec:
  selector: {sel:?}
  egress: [{{action: Allow, destination: {{namespaceSelector: {sel2:?}}}}}]"
        ),
        9 | 10 => {
            let ns = if slot == 9 { "ns1" } else { "ns2" };
            let env = if v.is_multiple_of(2) { "prod" } else { "dev" };
            format!(
                "apiVersion: projectcalico.org/v3
kind: Profile
metadata: {{name: kns.{ns}}}
spec:
  labelsToApply: {{pcns.env: {env}}}
  ingress: [{{action: Allow, source: {{selector: {sel:?}}}}}]"
            )
        }
        11 => format!(
            "apiVersion: projectcalico.org/v3
kind: Tier
metadata: {{name: t1}}
spec: {{order: {}}}",
            v * 500
        ),
        12 => format!(
            "apiVersion: projectcalico.org/v3
kind: GlobalNetworkSet
metadata:
  name: gns
  labels: {{{labels}}}
spec:
  nets: [10.{v}.0.0/16]"
        ),
        13 | 14 => {
            let name = if slot == 13 { HOST } else { "host2" };
            format!(
                "apiVersion: projectcalico.org/v3
kind: Node
metadata: {{name: {name}}}
spec:
  bgp: {{ipv4Address: 10.0.{}.{}/24}}
  ipv4VXLANTunnelAddr: 192.168.200.{}",
                v % 2,
                slot,
                slot
            )
        }
        15 => format!(
            "apiVersion: projectcalico.org/v3
kind: IPPool
metadata: {{name: pool}}
spec: {{cidr: 192.168.0.0/16, vxlanMode: {}, natOutgoing: {}}}",
            if v.is_multiple_of(2) {
                "Always"
            } else {
                "Never"
            },
            v.is_multiple_of(3)
        ),
        _ => format!(
            "apiVersion: projectcalico.org/v3
kind: HostEndpoint
metadata:
  name: hep
  labels: {{{labels}}}
spec:
  node: {HOST}
  interfaceName: eth0
  expectedIPs: [10.0.0.{}]",
            v + 1
        ),
    };
    Some(res(&yaml))
}

const SLOTS: usize = 17;
const VARIANTS: usize = 7;

fn key_of(slot: usize) -> margay_api::ResourceKey {
    resource(slot, 1).unwrap().key()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, .. ProptestConfig::default() })]

    #[test]
    fn incremental_equals_from_scratch(
        ops in prop::collection::vec((0..SLOTS, 0..VARIANTS, any::<bool>()), 1..60)
    ) {
        let mut h = Harness::new(config());
        for (slot, variant, flush) in ops {
            let key = key_of(slot);
            h.apply(&key, resource(slot, variant));
            if flush {
                h.flush();
            }
        }
        h.flush();
        let scratch = from_scratch(config(), &h.current);
        prop_assert_eq!(&h.model, &scratch);
        // And back to nothing: everything the graph created is removed again.
        let empty = State::new();
        h.go_to(&empty, Order::Forwards);
        prop_assert_eq!(&h.model, &from_scratch(config(), &empty));
    }
}
