//! Decoding behaviour: documents, lists, errors that name the field.
#![allow(clippy::unwrap_used)] // a panic in a test is a failure with a location

use margay_api::codec::{decode_documents, decode_one, decode_value, to_list_value, to_yaml};
use margay_api::{DecodeError, Kind, Resource};

fn errors(input: &str) -> Vec<String> {
    decode_documents(input)
        .unwrap()
        .into_iter()
        .filter_map(|d| d.result.err().map(|e| e.to_string()))
        .collect()
}

#[test]
fn multi_document_yaml_skips_empty_documents() {
    let input = "---\n# nothing here\n---\napiVersion: projectcalico.org/v3\nkind: Tier\nmetadata: {name: a}\nspec: {order: 10}\n---\n---\napiVersion: projectcalico.org/v3\nkind: Profile\nmetadata: {name: b}\n";
    let docs = decode_documents(input).unwrap();
    assert_eq!(docs.len(), 2);
    assert_eq!(docs[0].result.as_ref().unwrap().kind(), Kind::Tier);
    assert_eq!(docs[1].result.as_ref().unwrap().kind(), Kind::Profile);
    // Document numbers count empty documents too, so they match what an editor shows.
    assert!(docs[1].position.document > docs[0].position.document + 1);
}

#[test]
fn json_objects_streams_and_arrays() {
    let one = r#"{"apiVersion":"projectcalico.org/v3","kind":"Tier","metadata":{"name":"a"}}"#;
    let stream = format!("{one}\n{one}");
    assert_eq!(decode_documents(&stream).unwrap().len(), 2);
    let array = format!("[{one},{one},{one}]");
    assert_eq!(decode_documents(&array).unwrap().len(), 3);
    assert_eq!(decode_one(one).unwrap().name(), "a");
}

/// calicoctl splits its input at lines starting with `---` and reads each document as YAML
/// or JSON: JSON documents between separators, with or without a leading one, and JSON
/// indented with tabs (which YAML does not allow) all read.
#[test]
fn json_documents_separated_like_yaml() {
    let one = |n: &str| {
        format!(
            "{{\n\t\"apiVersion\": \"projectcalico.org/v3\",\n\t\"kind\": \"Tier\",\n\t\"metadata\": {{\"name\": \"{n}\"}}\n}}"
        )
    };
    for input in [
        format!("{}\n---\n{}\n", one("a"), one("b")),
        format!("---\n{}\n---\n{}\n", one("a"), one("b")),
        format!("--- # first\n{}\n---\n\n---\n{}", one("a"), one("b")),
        format!(
            "{}\n---\napiVersion: projectcalico.org/v3\nkind: Tier\nmetadata: {{name: b}}\n",
            one("a")
        ),
    ] {
        let docs = decode_documents(&input).unwrap_or_else(|e| panic!("{e}: {input}"));
        let names: Vec<&str> = docs
            .iter()
            .map(|d| d.result.as_ref().unwrap().name())
            .collect();
        assert_eq!(names, vec!["a", "b"], "{input}");
        assert!(docs[1].position.document > docs[0].position.document);
    }
    // A broken document is named.
    let err = decode_documents(&format!("{}\n---\n{{\"kind\": }}\n", one("a"))).unwrap_err();
    assert!(
        err.message.starts_with("document 2: invalid JSON"),
        "{}",
        err.message
    );
}

#[test]
fn list_kinds_expand_and_items_may_omit_type_meta() {
    let input = r#"
apiVersion: projectcalico.org/v3
kind: IPPoolList
metadata: {}
items:
  - metadata: {name: a}
    spec: {cidr: 10.0.0.0/16}
  - apiVersion: projectcalico.org/v3
    kind: IPPool
    metadata: {name: b}
    spec: {cidr: 10.1.0.0/16, blockSizee: 26}
"#;
    let docs = decode_documents(input).unwrap();
    assert_eq!(docs.len(), 2);
    assert_eq!(docs[0].result.as_ref().unwrap().name(), "a");
    assert_eq!(docs[1].position.item, Some(1));
    let err = docs[1].result.as_ref().unwrap_err().to_string();
    assert!(
        err.starts_with("items[1].spec.blockSizee: unknown field"),
        "{err}"
    );
    assert!(err.contains("did you mean \"blockSize\""), "{err}");

    let generic = "apiVersion: projectcalico.org/v3\nkind: List\nitems:\n- {apiVersion: projectcalico.org/v3, kind: Tier, metadata: {name: t}}\n- {apiVersion: projectcalico.org/v3, kind: Profile, metadata: {name: p}}\n";
    let kinds: Vec<Kind> = decode_documents(generic)
        .unwrap()
        .iter()
        .map(|d| d.result.as_ref().unwrap().kind())
        .collect();
    assert_eq!(kinds, vec![Kind::Tier, Kind::Profile]);
}

#[test]
fn errors_name_kind_version_and_fields() {
    let e = errors(
        "apiVersion: projectcalico.org/v3\nkind: GlobalNetworkPolicyy\nmetadata: {name: x}\n",
    );
    assert_eq!(
        e,
        vec!["kind: unknown kind \"GlobalNetworkPolicyy\" (did you mean \"GlobalNetworkPolicy\"?)"]
    );
    let e = errors("apiVersion: projectcalico.org/v3\nkind: gnp\nmetadata: {name: x}\n");
    assert!(
        e[0].contains("did you mean \"GlobalNetworkPolicy\""),
        "{e:?}"
    );
    let e = errors("apiVersion: crd.projectcalico.org/v1\nkind: IPPool\nmetadata: {name: x}\n");
    assert!(
        e[0].contains("use apiVersion: projectcalico.org/v3"),
        "{e:?}"
    );
    let e = errors("kind: IPPool\nmetadata: {name: x}\n");
    assert_eq!(
        e,
        vec!["apiVersion: missing (add apiVersion: projectcalico.org/v3)"]
    );
    let e = errors("apiVersion: projectcalico.org/v3\nmetadata: {name: x}\n");
    assert!(e[0].starts_with("kind: missing"), "{e:?}");
    let e = errors("- a\n- b\n");
    assert!(e[0].contains("not a mapping"), "{e:?}");
    let e = errors(
        "apiVersion: projectcalico.org/v3\nkind: NetworkPolicy\nmetadata: {name: x}\nspec:\n  ingress:\n    - action: Accept\n",
    );
    assert!(
        e[0].starts_with("spec.ingress[0].action: unknown variant `Accept`"),
        "{e:?}"
    );
    let e = errors(
        "apiVersion: projectcalico.org/v3\nkind: NetworkPolicy\nmetadata: {name: x}\nspec:\n  ingress:\n    - protocol: TCP\n",
    );
    assert_eq!(e, vec!["spec.ingress[0].action: required field is missing"]);
    let e = errors(
        "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: x, labels: {app: 1}}\n",
    );
    assert!(
        e[0].starts_with("metadata.labels[\"app\"]: invalid type"),
        "{e:?}"
    );
    let e = errors(
        "apiVersion: projectcalico.org/v3\nkind: BGPPeer\nmetadata: {name: x}\nspec: {asNumber: 1.10}\n",
    );
    assert!(e[0].contains("quote it"), "{e:?}");
    let e = errors(
        "apiVersion: projectcalico.org/v3\nkind: NetworkPolicy\nmetadata: {name: x}\nspec:\n  ingress:\n    - action: Allow\n      destination: {ports: [70000]}\n",
    );
    assert!(
        e[0].starts_with("spec.ingress[0].destination.ports[0]: port 70000 is out of range"),
        "{e:?}"
    );
}

#[test]
fn syntax_errors_are_reported_for_the_input() {
    let err = decode_documents("a: [1, 2\n").unwrap_err();
    assert!(err.message.starts_with("invalid YAML"), "{}", err.message);
    let err = decode_documents("{\"a\": }").unwrap_err();
    assert!(err.message.starts_with("invalid JSON"), "{}", err.message);
}

#[test]
fn decode_value_and_list_encoding() {
    let v = serde_json::json!({"apiVersion":"projectcalico.org/v3","kind":"IPPool","metadata":{"name":"p"},"spec":{"cidr":"10.0.0.0/16"}});
    let r = decode_value(v).unwrap();
    assert!(matches!(r, Resource::IPPool(_)));
    assert_eq!(
        decode_value(serde_json::json!({"a": 1})).unwrap_err(),
        DecodeError::MissingKind
    );
    let list = to_list_value(&[r.clone(), r.clone()]).unwrap();
    assert_eq!(list["kind"], "IPPoolList");
    let yaml = serde_norway::to_string(&list).unwrap();
    assert_eq!(decode_documents(&yaml).unwrap().len(), 2);
    let out = to_yaml(&r).unwrap();
    assert!(
        out.starts_with("apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata:\n"),
        "{out}"
    );
}

#[test]
fn type_meta_is_canonical_after_decoding() {
    let r =
        decode_one("apiVersion: projectcalico.org/v3\nkind: Tier\nmetadata: {name: t}\n").unwrap();
    let Resource::Tier(t) = r else {
        panic!("not a tier")
    };
    assert_eq!(t.api_version, "projectcalico.org/v3");
    assert_eq!(t.kind, "Tier");
}

fn messages(input: &str) -> Vec<String> {
    let docs = decode_documents(input).unwrap();
    assert_eq!(docs.len(), 1);
    docs[0].result.as_ref().expect_err("invalid").messages()
}

/// An operator sees every type error of a document at once, not one per attempt.
#[test]
fn every_type_error_of_a_document_is_reported() {
    let input = "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: p}\nspec:\n  cidr: 10.0.0.0/16\n  blockSize: many\n  natOutgoing: perhaps\n  disabled: [no]\n";
    let m = messages(input);
    assert_eq!(m.len(), 3, "{m:?}");
    // In the order of the fields' names (documents are read into sorted maps).
    assert!(m[0].starts_with("spec.blockSize: "), "{m:?}");
    assert!(m[1].starts_with("spec.disabled: "), "{m:?}");
    assert!(m[2].starts_with("spec.natOutgoing: "), "{m:?}");
}

/// List items taken out to go on decoding do not renumber the ones after them: the paths
/// are the items' positions as written.
#[test]
fn type_errors_in_list_items_keep_their_written_positions() {
    let input = "apiVersion: projectcalico.org/v3\nkind: GlobalNetworkPolicy\nmetadata: {name: p}\nspec:\n  ingress:\n  - action: Allow\n    protocol: TCP\n    destination:\n      ports: [80, true, 443, [1], 8080]\n  - action: [Deny]\n";
    let m = messages(input);
    assert_eq!(m.len(), 3, "{m:?}");
    assert!(
        m[0].starts_with("spec.ingress[0].destination.ports[1]: "),
        "{m:?}"
    );
    assert!(
        m[1].starts_with("spec.ingress[0].destination.ports[3]: "),
        "{m:?}"
    );
    assert!(m[2].starts_with("spec.ingress[1].action: "), "{m:?}");
}

/// Once the type errors are out of the way, the document's other problems are listed too;
/// a missing required field ends the list (nothing can stand in for it).
#[test]
fn type_errors_then_validation_problems_in_one_report() {
    let input = "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: p}\nspec:\n  cidr: 10.0.0.0/16\n  blockSize: 99\n  natOutgoing: perhaps\n";
    let m = messages(input);
    assert_eq!(m.len(), 2, "{m:?}");
    assert!(m[0].starts_with("spec.natOutgoing: "), "{m:?}");
    assert!(m[1].starts_with("spec.blockSize: "), "{m:?}");
    // One type error alone stays the single error it always was.
    let one = "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: p}\nspec:\n  cidr: 10.0.0.0/16\n  natOutgoing: perhaps\n";
    let docs = decode_documents(one).unwrap();
    assert!(matches!(
        docs[0].result,
        Err(DecodeError::Field { ref path, .. }) if path == "spec.natOutgoing"
    ));
}

/// A hostile document with thousands of wrong fields costs a bounded number of attempts.
#[test]
fn type_errors_are_bounded_per_document() {
    let mut input = String::from(
        "apiVersion: projectcalico.org/v3\nkind: GlobalNetworkSet\nmetadata: {name: s}\nspec:\n  nets:\n",
    );
    for _ in 0..5000 {
        input.push_str("  - [1]\n");
    }
    let m = messages(&input);
    assert_eq!(m.len(), 20, "{}", m.len());
    assert!(m[19].starts_with("spec.nets[19]: "), "{m:?}");
}
