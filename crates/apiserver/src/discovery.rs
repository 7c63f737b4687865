//! Discovery documents (`/api`, `/apis`, legacy and aggregated `apidiscovery.k8s.io/v2`,
//! per-group-version resource lists) and the OpenAPI v3 index kubectl's validation needs.
//! Pure: built from the served resources in discovery order.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::resources::{ALL_VERBS, ResourceDef};

/// The Content-Type an aggregated discovery reply must carry exactly.
pub const AGGREGATED_CT: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// Whether an Accept header asks for aggregated discovery v2 (kubectl ≥ 1.30 does; older
/// clients ask only for v2beta1 and must get the legacy form).
pub fn wants_aggregated(accept: &str) -> bool {
    accept.split(',').any(|part| {
        let params: Vec<&str> = part.split(';').map(str::trim).collect();
        params.contains(&"v=v2")
            && params.contains(&"as=APIGroupDiscoveryList")
            && params.contains(&"g=apidiscovery.k8s.io")
    })
}

/// Groups (non-core) in discovery order with their versions.
fn groups(defs: &[Arc<ResourceDef>]) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for d in defs.iter().filter(|d| !d.group.is_empty()) {
        match out.iter_mut().find(|(g, _)| *g == d.group) {
            Some((_, vs)) => {
                for v in &d.versions {
                    if !vs.contains(v) {
                        vs.push(v.clone());
                    }
                }
            }
            None => out.push((d.group.clone(), d.versions.clone())),
        }
    }
    out
}

pub fn legacy_api() -> Value {
    json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]})
}

fn group_json(g: &str, vs: &[String]) -> Value {
    let versions: Vec<Value> = vs
        .iter()
        .map(|v| json!({"groupVersion": format!("{g}/{v}"), "version": v}))
        .collect();
    json!({"name": g, "versions": versions, "preferredVersion": versions.first().cloned().unwrap_or(json!({}))})
}

pub fn legacy_apis(defs: &[Arc<ResourceDef>]) -> Value {
    let groups: Vec<Value> = groups(defs)
        .iter()
        .map(|(g, vs)| group_json(g, vs))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

pub fn legacy_group(defs: &[Arc<ResourceDef>], group: &str) -> Option<Value> {
    groups(defs)
        .iter()
        .find(|(g, _)| g == group)
        .map(|(g, vs)| {
            let mut v = group_json(g, vs);
            v["kind"] = json!("APIGroup");
            v["apiVersion"] = json!("v1");
            v
        })
}

fn verbs() -> Vec<&'static str> {
    ALL_VERBS.to_vec()
}

/// `/api/v1` or `/apis/<g>/<v>`: an APIResourceList, or None if nothing is served there.
pub fn resource_list(defs: &[Arc<ResourceDef>], group: &str, version: &str) -> Option<Value> {
    let mut resources = Vec::new();
    for d in defs
        .iter()
        .filter(|d| d.group == group && d.versions.iter().any(|v| v == version))
    {
        let mut r = json!({
            "name": d.plural,
            "singularName": d.singular,
            "namespaced": d.namespaced,
            "kind": d.kind,
            "verbs": verbs(),
        });
        if !d.short_names.is_empty() {
            r["shortNames"] = json!(d.short_names);
        }
        if !d.categories.is_empty() {
            r["categories"] = json!(d.categories);
        }
        resources.push(r);
        if d.status {
            resources.push(json!({"name": format!("{}/status", d.plural), "singularName": "", "namespaced": d.namespaced, "kind": d.kind, "verbs": ["get", "patch", "update"]}));
        }
    }
    if resources.is_empty() {
        return None;
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    )
}

fn aggregated_item(defs: &[Arc<ResourceDef>], group: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| {
            let resources: Vec<Value> = defs
                .iter()
                .filter(|d| d.group == group && d.versions.contains(v))
                .map(|d| {
                    let mut r = json!({
                        "resource": d.plural,
                        "responseKind": {"group": d.group, "version": v, "kind": d.kind},
                        "scope": if d.namespaced { "Namespaced" } else { "Cluster" },
                        "singularResource": d.singular,
                        "verbs": verbs(),
                    });
                    if !d.short_names.is_empty() {
                        r["shortNames"] = json!(d.short_names);
                    }
                    if !d.categories.is_empty() {
                        r["categories"] = json!(d.categories);
                    }
                    if d.status {
                        r["subresources"] = json!([{
                            "subresource": "status",
                            "responseKind": {"group": d.group, "version": v, "kind": d.kind},
                            "verbs": ["get", "patch", "update"],
                        }]);
                    }
                    r
                })
                .collect();
            json!({"version": v, "resources": resources, "freshness": "Current"})
        })
        .collect();
    json!({"metadata": {"name": group, "creationTimestamp": null}, "versions": vs})
}

/// Aggregated discovery: `/api` holds the core group only, `/apis` the others.
pub fn aggregated(defs: &[Arc<ResourceDef>], core: bool) -> Value {
    let items: Vec<Value> = if core {
        vec![aggregated_item(defs, "", &["v1".to_string()])]
    } else {
        groups(defs)
            .iter()
            .map(|(g, vs)| aggregated_item(defs, g, vs))
            .collect()
    };
    json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {}, "items": items})
}

/// `api/v1`, `apis/<g>/<v>` for every served group version.
pub fn group_versions(defs: &[Arc<ResourceDef>]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = vec![(String::new(), "v1".into())];
    for (g, vs) in groups(defs) {
        for v in vs {
            out.push((g.clone(), v));
        }
    }
    out
}

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// `/openapi/v3`: where each group version's document is.
pub fn openapi_index(defs: &[Arc<ResourceDef>], hash: u64) -> Value {
    let mut paths = serde_json::Map::new();
    for (g, v) in group_versions(defs) {
        let p = gv_path(&g, &v);
        paths.insert(
            p.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash={hash:016X}")}),
        );
    }
    json!({"paths": paths})
}

/// The per-group-version document: one path per resource with the operations kubectl looks
/// for (a `patch` whose GVK matches and which takes `fieldValidation`). No schemas.
pub fn openapi_doc(defs: &[Arc<ResourceDef>], group: &str, version: &str) -> Option<Value> {
    let mut paths = serde_json::Map::new();
    let prefix = if group.is_empty() {
        format!("/api/{version}")
    } else {
        format!("/apis/{group}/{version}")
    };
    let params = json!([
        {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
        {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
        {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
        {"name": "force", "in": "query", "schema": {"type": "boolean", "uniqueItems": true}},
    ]);
    let mut any = false;
    for d in defs
        .iter()
        .filter(|d| d.group == group && d.versions.iter().any(|v| v == version))
    {
        any = true;
        let gvk = json!({"group": d.group, "version": version, "kind": d.kind});
        let op = |action: &str| {
            json!({
                "operationId": format!("{action}{}", d.kind),
                "x-kubernetes-action": action,
                "x-kubernetes-group-version-kind": gvk,
                "parameters": params,
                "responses": {"200": {"description": "OK"}},
            })
        };
        let base = if d.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}", d.plural)
        } else {
            format!("{prefix}/{}", d.plural)
        };
        paths.insert(format!("{base}/{{name}}"), json!({"get": op("get"), "put": op("put"), "patch": op("patch"), "delete": op("delete")}));
        paths.insert(base.clone(), json!({"get": op("list"), "post": op("post")}));
        if d.status {
            paths.insert(
                format!("{base}/{{name}}/status"),
                json!({"get": op("get"), "put": op("put"), "patch": op("patch")}),
            );
        }
    }
    if !any {
        return None;
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.32.0"},
        "paths": paths,
        "components": {"schemas": {}},
    }))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::resources::{builtins, calico_crds, crd_to_def};

    fn defs() -> Vec<Arc<ResourceDef>> {
        let mut d: Vec<Arc<ResourceDef>> = builtins().into_iter().map(Arc::new).collect();
        d.extend(
            calico_crds()
                .iter()
                .map(|c| Arc::new(crd_to_def(c).unwrap())),
        );
        d
    }

    #[test]
    fn accept_negotiation() {
        assert!(wants_aggregated(
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json"
        ));
        assert!(!wants_aggregated(
            "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json"
        ));
        assert!(!wants_aggregated("application/json"));
    }

    #[test]
    fn builtin_groups_come_first() {
        let apis = legacy_apis(&defs());
        let names: Vec<&str> = apis["groups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "apps",
                "networking.k8s.io",
                "policy",
                "rbac.authorization.k8s.io",
                "discovery.k8s.io",
                "coordination.k8s.io",
                "apiextensions.k8s.io",
                "crd.projectcalico.org"
            ]
        );
        let agg = aggregated(&defs(), false);
        assert_eq!(agg["items"][0]["metadata"]["name"], "apps");
        let core = aggregated(&defs(), true);
        let pods = core["items"][0]["versions"][0]["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["resource"] == "pods")
            .unwrap()
            .clone();
        assert_eq!(pods["shortNames"], json!(["po"]));
        assert_eq!(pods["categories"], json!(["all"]));
        assert_eq!(pods["subresources"][0]["subresource"], "status");
    }

    #[test]
    fn openapi_has_patch_with_gvk_and_field_validation() {
        let doc = openapi_doc(&defs(), "crd.projectcalico.org", "v1").unwrap();
        let op = &doc["paths"]["/apis/crd.projectcalico.org/v1/ippools/{name}"]["patch"];
        assert_eq!(op["x-kubernetes-group-version-kind"]["kind"], "IPPool");
        assert!(
            op["parameters"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["name"] == "fieldValidation")
        );
        let idx = openapi_index(&defs(), 7);
        assert!(
            idx["paths"]["api/v1"]["serverRelativeURL"]
                .as_str()
                .unwrap()
                .starts_with("/openapi/v3/api/v1?hash=")
        );
        assert!(openapi_doc(&defs(), "nope.io", "v1").is_none());
    }
}
