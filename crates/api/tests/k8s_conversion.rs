//! Kubernetes NetworkPolicy → projectcalico.org/v3 NetworkPolicy: a table of cases modelled on
//! Calico's conversion tests (libcalico-go's conversion_test.go), each asserting the whole
//! converted resource, and the errors margay reports where Calico would drop or mangle a rule.
#![allow(clippy::unwrap_used)] // a panic in a test is a failure with a location

use margay_api::codec::{decode_documents, decode_one};
use margay_api::{DecodeError, Kind, Resource};

/// A Kubernetes NetworkPolicy `test.policy` in `default` with the given spec (indented by 2).
fn k8s(spec: &str) -> String {
    format!(
        "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: test.policy
  namespace: default
  uid: 30316465-6365-4463-ad63-3564622d3638
  resourceVersion: \"12345\"
  creationTimestamp: \"2024-01-01T00:00:00Z\"
  labels: {{team: a}}
spec:
{spec}"
    )
}

/// The v3 policy Calico makes of it: the given spec plus tier default and order 1000.
fn v3(spec: &str) -> String {
    format!(
        "apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata:
  name: knp.default.test.policy
  namespace: default
spec:
  tier: default
  order: 1000
{spec}"
    )
}

const ORCH: &str = "projectcalico.org/orchestrator == 'k8s'";

struct Case {
    name: &'static str,
    k8s: &'static str,
    v3: &'static str,
}

const CASES: &[Case] = &[
    Case {
        name: "basic: matchLabels sorted, ports default to TCP, a named port",
        k8s: "  podSelector:
    matchLabels: {label2: value2, label: value}
  ingress:
  - ports: [{port: 80}, {port: foo}]
    from:
    - podSelector: {matchLabels: {k2: v2, k: v}}
  policyTypes: [Ingress]
",
        v3: "  selector: ORCH && label == 'value' && label2 == 'value2'
  types: [Ingress]
  ingress:
  - action: Allow
    protocol: TCP
    source: {selector: ORCH && k == 'v' && k2 == 'v2'}
    destination: {ports: [80, foo]}
",
    },
    Case {
        name: "no ports: no protocol",
        k8s: "  podSelector: {matchLabels: {label: value, label2: value2}}
  ingress:
  - from:
    - podSelector: {matchLabels: {k: v, k2: v2}}
  policyTypes: [Ingress]
",
        v3: "  selector: ORCH && label == 'value' && label2 == 'value2'
  types: [Ingress]
  ingress:
  - action: Allow
    source: {selector: ORCH && k == 'v' && k2 == 'v2'}
",
    },
    Case {
        name: "a blank port entry allows every TCP port",
        k8s: "  podSelector: {matchLabels: {label: value}}
  ingress:
  - ports: [{port: 80}, {}]
    from:
    - podSelector: {matchLabels: {k: v}}
  policyTypes: [Ingress]
",
        v3: "  selector: ORCH && label == 'value'
  types: [Ingress]
  ingress:
  - action: Allow
    protocol: TCP
    source: {selector: ORCH && k == 'v'}
",
    },
    Case {
        name: "egress with blank ports and a UDP rule",
        k8s: "  podSelector: {matchLabels: {label: value}}
  egress:
  - ports: [{}, {port: 80}]
    to:
    - podSelector: {matchLabels: {k: v}}
  - ports: [{port: 53, protocol: UDP}]
  policyTypes: [Egress]
",
        v3: "  selector: ORCH && label == 'value'
  types: [Egress]
  egress:
  - action: Allow
    protocol: TCP
    destination: {selector: ORCH && k == 'v'}
  - action: Allow
    protocol: UDP
    destination: {ports: [53]}
",
    },
    Case {
        name: "no rules: default deny ingress",
        k8s: "  podSelector: {matchLabels: {label: value}}
  policyTypes: [Ingress]
",
        v3: "  selector: ORCH && label == 'value'
  types: [Ingress]
",
    },
    Case {
        name: "an empty ingress list is deny-all ingress too",
        k8s: "  podSelector: {}
  ingress: []
",
        v3: "  selector: ORCH
  types: [Ingress]
",
    },
    Case {
        name: "default deny egress",
        k8s: "  podSelector: {}
  policyTypes: [Egress]
",
        v3: "  selector: ORCH
  types: [Egress]
",
    },
    Case {
        name: "'- {}' allows everything",
        k8s: "  podSelector: {}
  ingress:
  - {}
  egress:
  - {}
  policyTypes: [Ingress, Egress]
",
        v3: "  selector: ORCH
  types: [Ingress, Egress]
  ingress:
  - action: Allow
  egress:
  - action: Allow
",
    },
    Case {
        name: "multiple peers: one rule each",
        k8s: "  podSelector: {matchLabels: {label: value}}
  ingress:
  - ports: [{}]
    from:
    - podSelector: {matchLabels: {k: v}}
    - podSelector: {matchLabels: {k2: v2}}
  policyTypes: [Ingress]
",
        v3: "  selector: ORCH && label == 'value'
  types: [Ingress]
  ingress:
  - action: Allow
    protocol: TCP
    source: {selector: ORCH && k == 'v'}
  - action: Allow
    protocol: TCP
    source: {selector: ORCH && k2 == 'v2'}
",
    },
    Case {
        name: "DoesNotExist expression",
        k8s: "  podSelector: {matchLabels: {label: value}}
  ingress:
  - ports: [{port: 80}, {port: foo}]
    from:
    - podSelector:
        matchExpressions: [{key: toast, operator: DoesNotExist}]
  policyTypes: [Ingress]
",
        v3: "  selector: ORCH && label == 'value'
  types: [Ingress]
  ingress:
  - action: Allow
    protocol: TCP
    source: {selector: ORCH && ! has(toast)}
    destination: {ports: [80, foo]}
",
    },
    Case {
        name: "multiple peers and ports: protocols sorted, then peers",
        k8s: "  podSelector: {matchLabels: {label: value}}
  ingress:
  - ports: [{port: 90, protocol: UDP}, {port: 80, protocol: TCP}]
    from:
    - podSelector: {matchLabels: {k: v}}
    - podSelector: {matchLabels: {k2: v2}}
  policyTypes: [Ingress]
",
        v3: "  selector: ORCH && label == 'value'
  types: [Ingress]
  ingress:
  - {action: Allow, protocol: TCP, source: {selector: ORCH && k == 'v'}, destination: {ports: [80]}}
  - {action: Allow, protocol: TCP, source: {selector: ORCH && k2 == 'v2'}, destination: {ports: [80]}}
  - {action: Allow, protocol: UDP, source: {selector: ORCH && k == 'v'}, destination: {ports: [90]}}
  - {action: Allow, protocol: UDP, source: {selector: ORCH && k2 == 'v2'}, destination: {ports: [90]}}
",
    },
    Case {
        name: "a namespaceSelector: unprefixed namespace labels, pods of any kind there",
        k8s: "  podSelector: {matchLabels: {label: value}}
  ingress:
  - from:
    - namespaceSelector: {matchLabels: {namespaceRole: dev, namespaceFoo: bar}}
  policyTypes: [Ingress]
",
        v3: "  selector: ORCH && label == 'value'
  types: [Ingress]
  ingress:
  - action: Allow
    source:
      selector: ORCH
      namespaceSelector: namespaceFoo == 'bar' && namespaceRole == 'dev'
",
    },
    Case {
        name: "no namespaceSelector: the policy's namespace",
        k8s: "  podSelector: {matchLabels: {label: value}}
  ingress:
  - from:
    - podSelector: {}
      namespaceSelector: null
  policyTypes: [Ingress]
",
        v3: "  selector: ORCH && label == 'value'
  types: [Ingress]
  ingress:
  - action: Allow
    source: {selector: ORCH}
",
    },
    Case {
        name: "an empty namespaceSelector: all namespaces",
        k8s: "  podSelector: {matchLabels: {label: value}}
  ingress:
  - from:
    - namespaceSelector: {matchLabels: {}}
  policyTypes: [Ingress]
",
        v3: "  selector: ORCH && label == 'value'
  types: [Ingress]
  ingress:
  - action: Allow
    source: {selector: ORCH, namespaceSelector: all()}
",
    },
    Case {
        name: "pod and namespace selectors in one peer (AND)",
        k8s: "  podSelector: {matchLabels: {label: value}}
  ingress:
  - from:
    - namespaceSelector: {matchLabels: {namespaceRole: dev, namespaceFoo: bar}}
      podSelector: {matchLabels: {podA: B, podC: D}}
  policyTypes: [Ingress]
",
        v3: "  selector: ORCH && label == 'value'
  types: [Ingress]
  ingress:
  - action: Allow
    source:
      selector: ORCH && podA == 'B' && podC == 'D'
      namespaceSelector: namespaceFoo == 'bar' && namespaceRole == 'dev'
",
    },
    Case {
        name: "matchExpressions: every operator, after matchLabels",
        k8s: "  podSelector:
    matchLabels: {app: web}
    matchExpressions:
    - {key: k, operator: In, values: [v1, v2]}
    - {key: env, operator: NotIn, values: [dev]}
    - {key: team, operator: Exists}
    - {key: legacy, operator: DoesNotExist}
  policyTypes: [Ingress]
",
        v3: "  selector: ORCH && app == 'web' && k in { 'v1', 'v2' } && env not in { 'dev' } && has(team) && ! has(legacy)
  types: [Ingress]
",
    },
    Case {
        name: "ports only",
        k8s: "  podSelector: {}
  ingress:
  - ports: [{protocol: TCP, port: 80}]
  policyTypes: [Ingress]
",
        v3: "  selector: ORCH
  types: [Ingress]
  ingress:
  - {action: Allow, protocol: TCP, destination: {ports: [80]}}
",
    },
    Case {
        name: "port range (endPort)",
        k8s: "  podSelector: {}
  ingress:
  - ports: [{protocol: TCP, port: 32000, endPort: 32768}]
  policyTypes: [Ingress]
",
        v3: "  selector: ORCH
  types: [Ingress]
  ingress:
  - {action: Allow, protocol: TCP, destination: {ports: ['32000:32768']}}
",
    },
    Case {
        name: "ports only and a port range (egress)",
        k8s: "  podSelector: {}
  egress:
  - ports: [{protocol: TCP, port: 80}]
  - ports: [{protocol: TCP, port: 32000, endPort: 32768}]
  policyTypes: [Egress]
",
        v3: "  selector: ORCH
  types: [Egress]
  egress:
  - {action: Allow, protocol: TCP, destination: {ports: [80]}}
  - {action: Allow, protocol: TCP, destination: {ports: ['32000:32768']}}
",
    },
    Case {
        name: "ipBlock with except (ingress)",
        k8s: "  podSelector: {}
  ingress:
  - from:
    - ipBlock: {cidr: 192.168.0.0/16, except: [192.168.3.0/24, 192.168.4.0/24]}
  policyTypes: [Ingress]
",
        v3: "  selector: ORCH
  types: [Ingress]
  ingress:
  - action: Allow
    source: {nets: [192.168.0.0/16], notNets: [192.168.3.0/24, 192.168.4.0/24]}
",
    },
    Case {
        name: "ipBlock with except and ports (egress): one rule per protocol",
        k8s: "  podSelector: {}
  egress:
  - ports: [{port: 90, protocol: UDP}, {port: 80, protocol: TCP}]
    to:
    - ipBlock:
        cidr: 192.168.0.0/16
        except: [192.168.3.0/24, 192.168.4.0/24, 192.168.5.0/24]
  policyTypes: [Egress]
",
        v3: "  selector: ORCH
  types: [Egress]
  egress:
  - action: Allow
    protocol: TCP
    destination:
      ports: [80]
      nets: [192.168.0.0/16]
      notNets: [192.168.3.0/24, 192.168.4.0/24, 192.168.5.0/24]
  - action: Allow
    protocol: UDP
    destination:
      ports: [90]
      nets: [192.168.0.0/16]
      notNets: [192.168.3.0/24, 192.168.4.0/24, 192.168.5.0/24]
",
    },
    Case {
        name: "an ipBlock's networks are masked; IPv6 works alike",
        k8s: "  podSelector: {}
  ingress:
  - from:
    - ipBlock: {cidr: 10.1.2.3/16}
    - ipBlock: {cidr: 'fd00:0:0:0:0:0:0:1/64', except: ['fd00::ff/120']}
",
        v3: "  selector: ORCH
  types: [Ingress]
  ingress:
  - {action: Allow, source: {nets: [10.1.0.0/16]}}
  - {action: Allow, source: {nets: ['fd00::/64'], notNets: ['fd00::/120']}}
",
    },
    Case {
        name: "both directions: types are Ingress then Egress",
        k8s: "  podSelector: {}
  ingress:
  - from:
    - ipBlock: {cidr: 192.168.0.0/16, except: [192.168.3.0/24, 192.168.4.0/24]}
  egress:
  - to:
    - ipBlock: {cidr: 10.10.0.0/16, except: [10.10.13.0/24]}
  policyTypes: [Egress, Ingress]
",
        v3: "  selector: ORCH
  types: [Ingress, Egress]
  ingress:
  - action: Allow
    source: {nets: [192.168.0.0/16], notNets: [192.168.3.0/24, 192.168.4.0/24]}
  egress:
  - action: Allow
    destination: {nets: [10.10.0.0/16], notNets: [10.10.13.0/24]}
",
    },
    Case {
        name: "no policyTypes (k8s <= 1.7 / defaulting): ingress only",
        k8s: "  podSelector: {matchLabels: {label: value}}
  ingress:
  - ports: [{port: 80}]
",
        v3: "  selector: ORCH && label == 'value'
  types: [Ingress]
  ingress:
  - {action: Allow, protocol: TCP, destination: {ports: [80]}}
",
    },
    Case {
        name: "no policyTypes with egress rules: Ingress and Egress (API server defaulting)",
        k8s: "  podSelector: {}
  egress:
  - ports: [{port: 53, protocol: UDP}]
",
        v3: "  selector: ORCH
  types: [Ingress, Egress]
  egress:
  - {action: Allow, protocol: UDP, destination: {ports: [53]}}
",
    },
    Case {
        name: "no podSelector at all: every pod of the namespace",
        k8s: "  policyTypes: [Ingress]
",
        v3: "  selector: ORCH
  types: [Ingress]
",
    },
    Case {
        name: "SCTP, a protocol without a port, endPort equal to port, merged port numbers",
        k8s: "  podSelector: {}
  ingress:
  - ports:
    - {protocol: UDP}
    - {protocol: UDP, port: 53}
    - {protocol: SCTP, port: 9000, endPort: 9000}
    - {port: 82}
    - {port: 80}
    - {port: 81}
    - {port: http}
    - {port: 8000, endPort: 8080}
    - {port: 8081}
",
        v3: "  selector: ORCH
  types: [Ingress]
  ingress:
  - {action: Allow, protocol: SCTP, destination: {ports: [9000]}}
  - {action: Allow, protocol: TCP, destination: {ports: [http, '80:82', '8000:8081']}}
  - {action: Allow, protocol: UDP}
",
    },
];

fn one(text: &str) -> Resource {
    decode_one(text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

#[test]
fn conversion_table() {
    for case in CASES {
        let got = one(&k8s(case.k8s));
        let want = one(&v3(&case.v3.replace("ORCH", ORCH)));
        assert_eq!(got, want, "{}", case.name);
        if let Err(e) = got.validate() {
            panic!("{}: converted policy does not validate: {e}", case.name);
        }
    }
}

#[test]
fn the_converted_policy_keeps_only_name_and_namespace() {
    let Resource::NetworkPolicy(p) = one(&k8s("  podSelector: {}\n")) else {
        panic!("not a NetworkPolicy")
    };
    assert_eq!(p.metadata.name, "knp.default.test.policy");
    assert_eq!(p.metadata.namespace, "default");
    // uid, resourceVersion, timestamps and labels belong to the Kubernetes object.
    assert_eq!(
        p.metadata,
        margay_api::ObjectMeta::namespaced("default", "knp.default.test.policy")
    );
    assert_eq!(p.spec.order, Some(1000.0));
    assert_eq!(p.spec.tier, "default");
}

#[test]
fn a_missing_namespace_is_left_for_the_command_to_fill_in() {
    let r = one(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: deny}\nspec: {podSelector: {}}\n",
    );
    assert_eq!(r.namespace(), "");
    assert_eq!(r.name(), "knp.default.deny");
}

fn errors_of(text: &str) -> Vec<String> {
    let docs = decode_documents(text).unwrap();
    assert_eq!(docs.len(), 1);
    match &docs[0].result {
        Ok(r) => panic!("expected an error, converted to {r:?}"),
        Err(e) => e.messages(),
    }
}

#[test]
fn bad_values_are_errors_naming_the_field() {
    let cases: &[(&str, &str)] = &[
        (
            "  ingress:\n  - from:\n    - podSelector: {}\n    - ipBlock: {cidr: 10.0.0.0/33}\n",
            "spec.ingress[0].from[1].ipBlock.cidr: \"10.0.0.0/33\" is not a valid CIDR: prefix length /33 exceeds /32",
        ),
        (
            "  ingress:\n  - from:\n    - ipBlock: {cidr: 10.0.0.1}\n",
            "spec.ingress[0].from[0].ipBlock.cidr: \"10.0.0.1\" is not a valid CIDR (expected ADDRESS/PREFIX, e.g. 10.0.0.0/16)",
        ),
        (
            "  egress:\n  - to:\n    - ipBlock: {cidr: 10.0.0.0/16, except: [10.1.0.0/24]}\n",
            "spec.egress[0].to[0].ipBlock.except[0]: \"10.1.0.0/24\" must be a strict subset of cidr 10.0.0.0/16",
        ),
        (
            "  ingress:\n  - ports: [{port: 70000}]\n",
            "spec.ingress[0].ports[0].port: 70000 is out of range (ports are 1-65535)",
        ),
        (
            "  ingress:\n  - ports: [{port: 0}]\n",
            "spec.ingress[0].ports[0].port: 0 is out of range (ports are 1-65535)",
        ),
        (
            "  ingress:\n  - ports: [{port: 90, endPort: 80}]\n",
            "spec.ingress[0].ports[0].endPort: 80 is less than port 90: endPort must be at least port",
        ),
        (
            "  ingress:\n  - ports: [{port: 90, endPort: 65536}]\n",
            "spec.ingress[0].ports[0].endPort: 65536 is out of range (ports are 1-65535)",
        ),
        (
            "  ingress:\n  - ports: [{endPort: 80}]\n",
            "spec.ingress[0].ports[0].endPort: may not be set without port",
        ),
        (
            "  ingress:\n  - ports: [{port: http, endPort: 80}]\n",
            "spec.ingress[0].ports[0].endPort: may not be set when port is a named port (\"http\")",
        ),
        (
            "  ingress:\n  - ports: [{port: \"80\"}]\n",
            "spec.ingress[0].ports[0].port: \"80\" is a port name, and port names need a letter: write the number without quotes (port: 80)",
        ),
        (
            "  ingress:\n  - ports: [{port: Web_Port}]\n",
            "spec.ingress[0].ports[0].port: \"Web_Port\" is not a valid port name (1-15 lower case letters, digits and '-', with at least one letter, not starting or ending with '-' and no '--')",
        ),
        (
            "  ingress:\n  - ports: [{protocol: tcp, port: 80}]\n",
            "spec.ingress[0].ports[0].protocol: \"tcp\" is not a supported protocol (protocol names are case-sensitive: use \"TCP\")",
        ),
        (
            "  ingress:\n  - ports: [{protocol: ICMP}]\n",
            "spec.ingress[0].ports[0].protocol: \"ICMP\" is not a supported protocol (use TCP, UDP or SCTP)",
        ),
        (
            "  policyTypes: [ingress]\n",
            "spec.policyTypes[0]: \"ingress\" is not a policy type (values are case-sensitive: use \"Ingress\")",
        ),
        (
            "  policyTypes: [Ingress, Egress, Ingress]\n",
            "spec.policyTypes: 3 entries: list at most Ingress and Egress",
        ),
        (
            "  ingress:\n  - from:\n    - {}\n",
            "spec.ingress[0].from[0]: empty peer: set podSelector, namespaceSelector or ipBlock (to allow every peer, leave the list out)",
        ),
        (
            "  ingress:\n  - from:\n    - ipBlock: {cidr: 10.0.0.0/8}\n      podSelector: {}\n",
            "spec.ingress[0].from[0]: ipBlock cannot be combined with podSelector or namespaceSelector in one peer (list them as separate peers)",
        ),
        (
            "  podSelector:\n    matchExpressions: [{key: app, operator: in, values: [a]}]\n",
            "spec.podSelector.matchExpressions[0].operator: \"in\" is not a label selector operator (operators are case-sensitive: use \"In\")",
        ),
        (
            "  podSelector:\n    matchExpressions: [{key: app, operator: In}]\n",
            "spec.podSelector.matchExpressions[0].values: must list at least one value for operator In",
        ),
        (
            "  podSelector:\n    matchExpressions: [{key: app, operator: Exists, values: [a]}]\n",
            "spec.podSelector.matchExpressions[0].values: must be empty for operator Exists",
        ),
        (
            "  ingress:\n  - from:\n    - namespaceSelector: {matchLabels: {\"bad key!\": x}}\n",
            "spec.ingress[0].from[0].namespaceSelector.matchLabels[\"bad key!\"]: label key \"bad key!\" is invalid: must consist of letters, digits, '-', '_' or '.', and start and end with a letter or digit",
        ),
        (
            "  podSelector: {matchLabels: {app: \"it's\"}}\n",
            "spec.podSelector.matchLabels[\"app\"]: label value \"it's\" is invalid: must consist of letters, digits, '-', '_' or '.', and start and end with a letter or digit",
        ),
    ];
    for (spec, want) in cases {
        let got = errors_of(&k8s(spec));
        assert_eq!(got, vec![want.to_string()], "{spec}");
    }
}

#[test]
fn every_problem_is_reported_at_once() {
    let got = errors_of(&k8s("  ingress:
  - ports: [{port: 0}, {protocol: udp}]
    from:
    - ipBlock: {cidr: nope}
  egress:
  - to:
    - {}
"));
    assert_eq!(
        got,
        vec![
            "spec.ingress[0].ports[0].port: 0 is out of range (ports are 1-65535)",
            "spec.ingress[0].ports[1].protocol: \"udp\" is not a supported protocol (protocol names are case-sensitive: use \"UDP\")",
            "spec.ingress[0].from[0].ipBlock.cidr: \"nope\" is not a valid CIDR (expected ADDRESS/PREFIX, e.g. 10.0.0.0/16)",
            "spec.egress[0].to[0]: empty peer: set podSelector, namespaceSelector or ipBlock (to allow every peer, leave the list out)",
        ]
    );
}

#[test]
fn unknown_fields_and_wrong_types_are_errors_like_the_v3_decoder() {
    let cases: &[(&str, &str)] = &[
        (
            "  podSelecter: {}\n",
            "spec.podSelecter: unknown field \"podSelecter\" (did you mean \"podSelector\"?)",
        ),
        (
            "  ingress:\n  - from:\n    - ipBlock: {cidr: 10.0.0.0/8, excpt: []}\n",
            "spec.ingress[0].from[0].ipBlock.excpt: unknown field \"excpt\" (did you mean \"except\"?)",
        ),
        (
            "  ingress:\n  - ports: [{port: 80, endport: 90}]\n",
            "spec.ingress[0].ports[0].endport: unknown field \"endport\" (did you mean \"endPort\"?)",
        ),
        (
            "  ingress:\n  - from:\n    - ipBlock: {except: []}\n",
            "spec.ingress[0].from[0].ipBlock.cidr: required field is missing",
        ),
        (
            "  podSelector: {matchLabels: {version: 1}}\n",
            "spec.podSelector.matchLabels[\"version\"]: invalid type: integer `1`, expected a string",
        ),
        (
            "  ingress:\n  - ports: [{port: 1.5}]\n",
            "spec.ingress[0].ports[0].port: invalid type: floating point `1.5`, expected a port number or a port name",
        ),
    ];
    for (spec, want) in cases {
        let got = errors_of(&k8s(spec));
        assert_eq!(got, vec![want.to_string()], "{spec}");
    }
    let got = errors_of(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: x, namespace: a}\nspecc: {}\n",
    );
    assert_eq!(
        got,
        vec!["specc: unknown field \"specc\" (did you mean \"spec\"?)"]
    );
    let got = errors_of(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {namespace: a}\n",
    );
    assert_eq!(
        got,
        vec!["metadata.name: required: the policy is stored as knp.default.<name>"]
    );
    let got = errors_of("apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: x}\n");
    assert_eq!(
        got,
        vec![
            "kind: \"Ingress\" of networking.k8s.io/v1 is not supported (margay reads only NetworkPolicy from networking.k8s.io/v1; other documents use apiVersion: projectcalico.org/v3)"
        ]
    );
}

#[test]
fn an_invalid_name_is_caught_by_v3_validation_of_the_converted_policy() {
    let r = one(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: Bad_Name, namespace: a}\n",
    );
    let e = r.validate().unwrap_err().to_string();
    assert!(
        e.starts_with("metadata.name: \"knp.default.Bad_Name\""),
        "{e}"
    );
}

#[test]
fn lists_and_mixed_documents() {
    let text = "apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata: {name: calico-one, namespace: prod}
spec: {selector: all(), types: [Ingress]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: k8s-one, namespace: prod}
spec: {podSelector: {}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicyList
metadata: {}
items:
- metadata: {name: in-typed-list, namespace: prod}
  spec: {podSelector: {}}
- metadata: {name: bad, namespace: prod}
  spec: {ingress: [{ports: [{port: 0}]}]}
---
apiVersion: v1
kind: List
items:
- apiVersion: networking.k8s.io/v1
  kind: NetworkPolicy
  metadata: {name: in-kubectl-list, namespace: prod}
  spec: {podSelector: {}}
- apiVersion: projectcalico.org/v3
  kind: Tier
  metadata: {name: security}
  spec: {order: 100}
---
apiVersion: projectcalico.org/v3
kind: List
items:
- apiVersion: networking.k8s.io/v1
  kind: NetworkPolicy
  metadata: {name: in-calico-list, namespace: prod}
";
    let docs = decode_documents(text).unwrap();
    let got: Vec<Result<(Kind, String), Vec<String>>> = docs
        .iter()
        .map(|d| match &d.result {
            Ok(r) => Ok((r.kind(), r.name().to_string())),
            Err(e) => Err(e.messages()),
        })
        .collect();
    assert_eq!(
        got,
        vec![
            Ok((Kind::NetworkPolicy, "calico-one".into())),
            Ok((Kind::NetworkPolicy, "knp.default.k8s-one".into())),
            Ok((Kind::NetworkPolicy, "knp.default.in-typed-list".into())),
            Err(vec![
                "items[1].spec.ingress[0].ports[0].port: 0 is out of range (ports are 1-65535)"
                    .to_string()
            ]),
            Ok((Kind::NetworkPolicy, "knp.default.in-kubectl-list".into())),
            Ok((Kind::Tier, "security".into())),
            Ok((Kind::NetworkPolicy, "knp.default.in-calico-list".into())),
        ]
    );
    // The v3 typed list kind still means v3 items.
    let docs = decode_documents(
        "apiVersion: projectcalico.org/v3\nkind: NetworkPolicyList\nitems:\n- metadata: {name: a, namespace: b}\n",
    )
    .unwrap();
    assert_eq!(docs[0].result.as_ref().unwrap().name(), "a");
    // A kubectl `List` is only accepted with its own apiVersion or Calico's.
    let docs = decode_documents("apiVersion: v2\nkind: List\nitems: []\n").unwrap();
    assert!(matches!(
        docs[0].result,
        Err(DecodeError::ApiVersion { .. })
    ));
}

#[test]
fn json_input_works_too() {
    let r = one(
        r#"{"apiVersion":"networking.k8s.io/v1","kind":"NetworkPolicy","metadata":{"name":"web","namespace":"shop"},"spec":{"podSelector":{"matchLabels":{"app":"web"}},"ingress":[{"ports":[{"port":443}]}]}}"#,
    );
    let want = one(&format!(
        "apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata: {{name: knp.default.web, namespace: shop}}
spec:
  tier: default
  order: 1000
  selector: {ORCH} && app == 'web'
  types: [Ingress]
  ingress:
  - {{action: Allow, protocol: TCP, destination: {{ports: [443]}}}}
"
    ));
    assert_eq!(r, want);
}

mod props {
    use margay_api::codec::decode_documents;
    use proptest::prelude::*;
    use serde_json::{Value, json};

    /// Mostly valid values, sometimes an invalid one.
    fn mostly(
        valid: &'static [&'static str],
        invalid: &'static [&'static str],
    ) -> impl Strategy<Value = Value> {
        prop_oneof![
            12 => proptest::sample::select(valid),
            1 => proptest::sample::select(invalid),
        ]
        .prop_map(|s| Value::String(s.to_string()))
    }

    fn label_selector() -> impl Strategy<Value = Value> {
        let labels = proptest::collection::btree_map(
            mostly(&["app", "k8s.io/name", "tier", "x"], &["bad key"])
                .prop_map(|v| v.as_str().unwrap_or_default().to_string()),
            mostly(&["web", "", "v1.2", "a_b"], &["-bad"]),
            0..3,
        );
        let expr = prop_oneof![
            (
                mostly(&["app", "env"], &["bad key"]),
                mostly(&["In", "NotIn"], &["in"]),
                proptest::collection::vec(mostly(&["a", "b", "c-d"], &["bad value"]), 1..3),
            )
                .prop_map(|(k, op, vals)| json!({"key": k, "operator": op, "values": vals})),
            (
                mostly(&["app", "env"], &["bad key"]),
                mostly(&["Exists", "DoesNotExist"], &["In"]),
            )
                .prop_map(|(k, op)| json!({"key": k, "operator": op})),
        ];
        (labels, proptest::collection::vec(expr, 0..3))
            .prop_map(|(l, e)| json!({"matchLabels": l, "matchExpressions": e}))
    }

    fn peer() -> impl Strategy<Value = Value> {
        prop_oneof![
            4 => label_selector().prop_map(|s| json!({"podSelector": s})),
            4 => label_selector().prop_map(|s| json!({"namespaceSelector": s})),
            4 => (label_selector(), label_selector())
                .prop_map(|(p, n)| json!({"podSelector": p, "namespaceSelector": n})),
            4 => (
                mostly(
                    &["10.0.0.0/8", "10.1.2.3/16", "0.0.0.0/0"],
                    &["10.0.0.0/40", "x", "fd00::/64"]
                ),
                proptest::collection::vec(
                    mostly(&["10.1.0.0/16", "10.1.2.0/24"], &["10.0.0.0/8", "fd00::/96", "11.0.0.0/16"]),
                    0..3
                ),
            )
                .prop_map(|(c, e)| json!({"ipBlock": {"cidr": c, "except": e}})),
            1 => Just(json!({})),
        ]
    }

    fn port() -> impl Strategy<Value = Value> {
        (
            prop_oneof![
                Just(Value::Null),
                (0i64..70000).prop_map(|p| json!(p)),
                (1i64..65536).prop_map(|p| json!(p)),
                mostly(&["http", "metrics"], &["80", "Bad_Name"]),
            ],
            prop_oneof![
                4 => Just(None),
                1 => (0i64..70000).prop_map(Some),
            ],
            proptest::option::of(mostly(&["TCP", "UDP", "SCTP"], &["tcp", "ICMP"])),
        )
            .prop_map(|(port, end, proto)| {
                let mut m = serde_json::Map::new();
                if !port.is_null() {
                    m.insert("port".into(), port);
                }
                if let Some(e) = end {
                    m.insert("endPort".into(), json!(e));
                }
                if let Some(p) = proto {
                    m.insert("protocol".into(), p);
                }
                Value::Object(m)
            })
    }

    fn rule(peers_field: &'static str) -> impl Strategy<Value = Value> {
        (
            proptest::collection::vec(peer(), 0..3),
            proptest::collection::vec(port(), 0..4),
        )
            .prop_map(move |(peers, ports)| json!({peers_field: peers, "ports": ports}))
    }

    fn policy() -> impl Strategy<Value = Value> {
        (
            label_selector(),
            proptest::collection::vec(rule("from"), 0..3),
            proptest::collection::vec(rule("to"), 0..3),
            proptest::collection::vec(mostly(&["Ingress", "Egress"], &["ingress"]), 0..3),
        )
            .prop_map(|(sel, ingress, egress, types)| {
                json!({
                    "apiVersion": "networking.k8s.io/v1",
                    "kind": "NetworkPolicy",
                    "metadata": {"name": "p", "namespace": "ns"},
                    "spec": {
                        "podSelector": sel,
                        "ingress": ingress,
                        "egress": egress,
                        "policyTypes": types,
                    }
                })
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Conversion never panics, and whatever converts is a valid v3 policy: the
        /// Kubernetes-side checks leave nothing for v3 validation to find.
        #[test]
        fn whatever_converts_validates(doc in policy()) {
            let docs = decode_documents(&doc.to_string()).unwrap();
            prop_assert_eq!(docs.len(), 1);
            match &docs[0].result {
                Ok(r) => prop_assert!(r.validate().is_ok(), "{:?}\n{}", r.validate(), doc),
                Err(e) => prop_assert!(!e.messages().is_empty()),
            }
        }
    }
}
