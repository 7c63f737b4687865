//! Tests of Kubernetes NetworkPolicy handling.

use super::*;

// ---------------------------------------------------------------- Kubernetes NetworkPolicy

fn k8s_policy(name: &str, namespace: Option<&str>, port: u32) -> String {
    let ns = namespace
        .map(|n| format!("  namespace: {n}\n"))
        .unwrap_or_default();
    format!(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n  name: {name}\n{ns}spec:\n  podSelector:\n    matchLabels: {{app: web}}\n  ingress:\n  - from:\n    - namespaceSelector: {{matchLabels: {{env: prod}}}}\n    ports:\n    - port: {port}\n"
    )
}

#[test]
fn apply_get_and_delete_a_kubernetes_network_policy() {
    let ctl = Ctl::new();
    let f = ctl.file("netpol.yaml", &k8s_policy("allow-web", Some("shop"), 80));
    let o = ctl.run(&["apply", "-f", &f]);
    assert_eq!(o.code, EXIT_OK, "{o:?}");
    assert_eq!(
        o.out,
        "Successfully applied 1 'NetworkPolicy' resource(s)\n"
    );

    // Stored as Calico stores a Kubernetes policy.
    let Some(Resource::NetworkPolicy(p)) =
        ctl.stored(Kind::NetworkPolicy, "shop", "knp.default.allow-web")
    else {
        panic!("not stored")
    };
    assert_eq!(p.spec.tier, "default");
    assert_eq!(p.spec.order, Some(1000.0));
    assert_eq!(
        p.spec.selector,
        "projectcalico.org/orchestrator == 'k8s' && app == 'web'"
    );
    assert_eq!(p.spec.ingress[0].source.namespace_selector, "env == 'prod'");

    // Applying it again changes nothing; a changed port updates it.
    let o = ctl.run(&["apply", "-f", &f]);
    assert_eq!(o.code, EXIT_OK, "{o:?}");
    assert_eq!(o.err, "0 created, 0 updated, 1 unchanged\n");
    let f2 = ctl.file("netpol2.yaml", &k8s_policy("allow-web", Some("shop"), 8080));
    let o = ctl.run(&["apply", "-f", &f2]);
    assert_eq!(o.err, "0 created, 1 updated, 0 unchanged\n", "{o:?}");
    let o = ctl.run(&["replace", "-f", &f]);
    assert_eq!(o.code, EXIT_OK, "{o:?}");

    // get by the v3 name, by the Kubernetes kind and name, and listings.
    let o = ctl.run(&[
        "get",
        "networkpolicy",
        "knp.default.allow-web",
        "-n",
        "shop",
        "-o",
        "yaml",
    ]);
    assert_eq!(o.code, EXIT_OK, "{o:?}");
    let v: serde_json::Value = serde_norway::from_str(&o.out).unwrap();
    assert_eq!(v["kind"], "NetworkPolicy");
    assert_eq!(v["spec"]["ingress"][0]["destination"]["ports"][0], 80);
    for kind in [
        "networkpolicies.networking.k8s.io",
        "NetworkPolicy.networking.k8s.io",
        "netpol",
    ] {
        let o = ctl.run(&["get", kind, "allow-web", "-n", "shop", "-o", "name"]);
        assert_eq!(o.code, EXIT_OK, "{kind}: {o:?}");
        assert_eq!(
            o.out,
            "networkpolicy.projectcalico.org/knp.default.allow-web\n"
        );
    }
    // The Kubernetes kind lists only converted policies; networkpolicy lists them all.
    let f3 = ctl.file("calico.yaml", &policy("calico-own", Some("shop"), "all()"));
    assert_eq!(ctl.run(&["create", "-f", &f3]).code, EXIT_OK);
    let o = ctl.run(&["get", "netpol", "-n", "shop", "-o", "name"]);
    assert_eq!(
        o.out,
        "networkpolicy.projectcalico.org/knp.default.allow-web\n"
    );
    let o = ctl.run(&["get", "networkpolicies", "-n", "shop", "-o", "name"]);
    assert_eq!(o.out.lines().count(), 2, "{o:?}");

    // delete -f with the Kubernetes document deletes the converted policy.
    let o = ctl.run(&["delete", "-f", &f]);
    assert_eq!(o.code, EXIT_OK, "{o:?}");
    assert_eq!(
        o.out,
        "Successfully deleted 1 'NetworkPolicy' resource(s)\n"
    );
    assert!(
        ctl.stored(Kind::NetworkPolicy, "shop", "knp.default.allow-web")
            .is_none()
    );
    assert!(
        ctl.stored(Kind::NetworkPolicy, "shop", "calico-own")
            .is_some()
    );

    // delete by the Kubernetes kind and name.
    assert_eq!(ctl.run(&["create", "-f", &f]).code, EXIT_OK);
    let o = ctl.run(&[
        "delete",
        "networkpolicies.networking.k8s.io",
        "allow-web",
        "-n",
        "shop",
    ]);
    assert_eq!(o.code, EXIT_OK, "{o:?}");
    assert!(
        ctl.stored(Kind::NetworkPolicy, "shop", "knp.default.allow-web")
            .is_none()
    );
}

#[test]
fn kubernetes_and_calico_documents_mix_in_one_file() {
    let ctl = Ctl::new();
    let text = [
        k8s_policy("from-k8s", None, 443),
        policy("from-calico", None, "all()"),
        "apiVersion: v1\nkind: List\nitems:\n- apiVersion: networking.k8s.io/v1\n  kind: NetworkPolicy\n  metadata: {name: in-list}\n  spec: {podSelector: {}, policyTypes: [Egress]}\n".to_string(),
    ]
    .join("---\n");
    let f = ctl.file("mixed.yaml", &text);
    let o = ctl.run(&["create", "-f", &f, "-n", "team"]);
    assert_eq!(o.code, EXIT_OK, "{o:?}");
    assert_eq!(
        o.out,
        "Successfully created 3 'NetworkPolicy' resource(s)\n"
    );
    for name in ["knp.default.from-k8s", "from-calico", "knp.default.in-list"] {
        assert!(
            ctl.stored(Kind::NetworkPolicy, "team", name).is_some(),
            "{name}"
        );
    }
    let o = ctl.run(&["validate", "-f", &f]);
    assert_eq!(o.code, EXIT_OK, "{o:?}");
    assert_eq!(o.out, "3 documents are valid\n");
}

#[test]
fn an_invalid_kubernetes_policy_reports_every_problem_and_is_not_written() {
    let ctl = Ctl::new();
    let bad = "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: bad, namespace: shop}
spec:
  ingress:
  - from:
    - podSelector: {}
    - ipBlock: {cidr: 10.0.0.0/33}
    ports:
    - {port: 90, endPort: 80}
";
    let f = ctl.file(
        "bad.yaml",
        &[bad.to_string(), k8s_policy("good", Some("shop"), 80)].join("---\n"),
    );
    let o = ctl.run(&["apply", "-f", &f]);
    assert_eq!(o.code, EXIT_INVALID, "{o:?}");
    let prefix = format!("{f} [document 1] NetworkPolicy/shop/bad: ");
    assert!(
        o.err.contains(&format!(
            "{prefix}spec.ingress[0].ports[0].endPort: 80 is less than port 90: endPort must be at least port\n"
        )),
        "{o:?}"
    );
    assert!(
        o.err.contains(&format!(
            "{prefix}spec.ingress[0].from[1].ipBlock.cidr: \"10.0.0.0/33\" is not a valid CIDR: prefix length /33 exceeds /32\n"
        )),
        "{o:?}"
    );
    assert_eq!(
        o.out,
        "Partial success: applied 1 out of 2 'NetworkPolicy' resources\n"
    );
    assert!(
        ctl.stored(Kind::NetworkPolicy, "shop", "knp.default.bad")
            .is_none()
    );
    assert!(
        ctl.stored(Kind::NetworkPolicy, "shop", "knp.default.good")
            .is_some()
    );

    let o = ctl.run(&["validate", "-f", &f]);
    assert_eq!(o.code, EXIT_INVALID, "{o:?}");
    assert_eq!(o.out.lines().count(), 2, "{o:?}");
    assert!(o.err.contains("1 of 2 documents are invalid"), "{o:?}");

    let typo = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: typo}\nspec: {podSelector: {matchLabel: {app: x}}}\n";
    let f = ctl.file("typo.yaml", typo);
    let o = ctl.run(&["create", "-f", &f]);
    assert_eq!(o.code, EXIT_INVALID, "{o:?}");
    assert!(
        o.err.contains("spec.podSelector.matchLabel: unknown field \"matchLabel\" (did you mean \"matchLabels\"?)"),
        "{o:?}"
    );
}

#[test]
fn derived_kinds_are_read_only_in_the_kubernetes_datastore() {
    use crate::write_cmd::{Action, derived_refusal_for};
    let create = Action::Create { skip_exists: false };
    let delete = Action::Delete {
        skip_not_exists: false,
    };
    for (kind, name) in [
        (Kind::WorkloadEndpoint, "n1-k8s-web-eth0"),
        (Kind::Profile, "kns.prod"),
        (Kind::NetworkPolicy, "knp.default.deny"),
    ] {
        for action in [create, Action::Apply, Action::Replace, delete] {
            let why = derived_refusal_for(true, action, kind, name)
                .unwrap_or_else(|| panic!("{kind} {name} must be refused"));
            assert!(
                why.contains("Kubernetes datastore") && why.contains("kubectl"),
                "{why}"
            );
            assert_eq!(derived_refusal_for(false, action, kind, name), None);
        }
    }
    assert!(derived_refusal_for(true, create, Kind::Node, "n1").is_some());
    assert!(derived_refusal_for(true, delete, Kind::Node, "n1").is_some());
    assert_eq!(
        derived_refusal_for(true, Action::Apply, Kind::Node, "n1"),
        None
    );
    assert_eq!(
        derived_refusal_for(true, create, Kind::NetworkPolicy, "web"),
        None
    );
    assert_eq!(
        derived_refusal_for(true, create, Kind::IPPool, "pool"),
        None
    );
}
