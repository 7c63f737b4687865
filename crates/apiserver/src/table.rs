//! `as=Table` responses: the columns `kubectl get` prints, per kind. Pure (the caller passes
//! the clock).

use serde_json::{Value, json};

use crate::resources::ResourceDef;
use crate::util;

/// What a row's `object` holds (`includeObject`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Include {
    None,
    #[default]
    Metadata,
    Object,
}

impl Include {
    pub fn parse(s: &str) -> Include {
        match s {
            "None" => Include::None,
            "Object" => Include::Object,
            _ => Include::Metadata,
        }
    }
}

/// The form objects are answered in (negotiated from the Accept header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Object,
    Table(Include),
    /// `as=PartialObjectMetadata[List]`: metadata only.
    Meta,
}

impl Shape {
    /// The first Accept entry decides (clients list their preference first).
    pub fn from_accept(accept: &str, include: &str) -> Shape {
        let Some(first) = accept.split(',').next() else {
            return Shape::Object;
        };
        let p: Vec<&str> = first.split(';').map(str::trim).collect();
        if !p.contains(&"g=meta.k8s.io") {
            return Shape::Object;
        }
        if p.contains(&"as=Table") {
            Shape::Table(Include::parse(include))
        } else if p.contains(&"as=PartialObjectMetadata")
            || p.contains(&"as=PartialObjectMetadataList")
        {
            Shape::Meta
        } else {
            Shape::Object
        }
    }
}

/// `PartialObjectMetadata` of an object.
pub fn partial(obj: &Value) -> Value {
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj.get("metadata").cloned().unwrap_or(json!({}))})
}

fn col(name: &str, ty: &str, format: &str, priority: u8, desc: &str) -> Value {
    json!({"name": name, "type": ty, "format": format, "description": desc, "priority": priority})
}

pub fn columns(def: &ResourceDef) -> Vec<Value> {
    let name = col(
        "Name",
        "string",
        "name",
        0,
        "Name must be unique within a namespace.",
    );
    let age = col(
        "Age",
        "string",
        "",
        0,
        "CreationTimestamp is a timestamp representing the server time when this object was created.",
    );
    let s = |n: &str, p: u8| col(n, "string", "", p, "");
    if !def.builtin {
        let mut c = vec![name];
        for pc in &def.printer_columns {
            let n = pc.get("name").and_then(Value::as_str).unwrap_or("");
            let ty = pc.get("type").and_then(Value::as_str).unwrap_or("string");
            let pr = pc
                .get("priority")
                .and_then(Value::as_u64)
                .unwrap_or(0)
                .min(10) as u8;
            c.push(col(
                n,
                ty,
                pc.get("format").and_then(Value::as_str).unwrap_or(""),
                pr,
                pc.get("description").and_then(Value::as_str).unwrap_or(""),
            ));
        }
        if !def.printer_columns.iter().any(|p| {
            p.get("jsonPath").and_then(Value::as_str) == Some(".metadata.creationTimestamp")
        }) {
            c.push(age);
        }
        return c;
    }
    match def.kind.as_str() {
        "Pod" => vec![
            name,
            s("Ready", 0),
            s("Status", 0),
            col("Restarts", "string", "", 0, ""),
            age,
            s("IP", 1),
            s("Node", 1),
            s("Nominated Node", 1),
            s("Readiness Gates", 1),
        ],
        "Node" => vec![
            name,
            s("Status", 0),
            s("Roles", 0),
            age,
            s("Version", 0),
            s("Internal-IP", 1),
            s("External-IP", 1),
        ],
        "Namespace" => vec![name, s("Status", 0), age],
        "Service" => vec![
            name,
            s("Type", 0),
            s("Cluster-IP", 0),
            s("External-IP", 0),
            s("Port(s)", 0),
            age,
            s("Selector", 1),
        ],
        "ConfigMap" => vec![name, col("Data", "integer", "", 0, ""), age],
        "Secret" => vec![name, s("Type", 0), col("Data", "integer", "", 0, ""), age],
        "ServiceAccount" => vec![name, col("Secrets", "integer", "", 0, ""), age],
        "Endpoints" => vec![name, s("Endpoints", 0), age],
        "NetworkPolicy" => vec![name, s("Pod-Selector", 0), age],
        "EndpointSlice" => vec![
            name,
            s("AddressType", 0),
            s("Ports", 0),
            s("Endpoints", 0),
            age,
        ],
        "CustomResourceDefinition" => vec![name, col("Created At", "date", "", 0, "")],
        _ => vec![name, age],
    }
}

fn age(obj: &Value, now: i64) -> Value {
    match obj
        .pointer("/metadata/creationTimestamp")
        .and_then(Value::as_str)
        .and_then(util::parse_rfc3339)
    {
        Some(t) => json!(util::human_duration(now - t)),
        None => json!("<unknown>"),
    }
}

fn s(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(v) => v.to_string(),
    }
}

fn or_none(x: String) -> String {
    if x.is_empty() { "<none>".into() } else { x }
}

/// Evaluates the simple `.a.b.c` JSONPath CRD printer columns use.
fn json_path<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    let mut cur = obj;
    for part in path
        .trim_start_matches('.')
        .split('.')
        .filter(|p| !p.is_empty())
    {
        cur = cur.get(part)?;
    }
    Some(cur)
}

fn selector_string(sel: Option<&Value>) -> String {
    let Some(m) = sel
        .and_then(|v| v.get("matchLabels"))
        .and_then(Value::as_object)
    else {
        return if sel.is_some_and(|v| v.as_object().is_some_and(|m| m.is_empty())) {
            "<none>".into()
        } else {
            String::new()
        };
    };
    m.iter()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
        .collect::<Vec<_>>()
        .join(",")
}

pub fn cells(def: &ResourceDef, obj: &Value, now: i64) -> Vec<Value> {
    let name = json!(
        obj.pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
    );
    let p = |ptr: &str| obj.pointer(ptr);
    if !def.builtin {
        let mut c = vec![name];
        for pc in &def.printer_columns {
            let path = pc.get("jsonPath").and_then(Value::as_str).unwrap_or("");
            c.push(json_path(obj, path).cloned().unwrap_or(Value::Null));
        }
        if !def.printer_columns.iter().any(|p| {
            p.get("jsonPath").and_then(Value::as_str) == Some(".metadata.creationTimestamp")
        }) {
            c.push(age(obj, now));
        }
        return c;
    }
    match def.kind.as_str() {
        "Pod" => {
            let total = p("/spec/containers")
                .and_then(Value::as_array)
                .map_or(0, Vec::len);
            let statuses = p("/status/containerStatuses")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let ready = statuses
                .iter()
                .filter(|c| c.get("ready") == Some(&json!(true)))
                .count();
            let restarts: i64 = statuses
                .iter()
                .filter_map(|c| c.get("restartCount").and_then(Value::as_i64))
                .sum();
            let mut status = s(p("/status/reason"));
            if status.is_empty() {
                status = s(p("/status/phase"));
            }
            if p("/metadata/deletionTimestamp").is_some() {
                status = "Terminating".into();
            }
            vec![
                name,
                json!(format!("{ready}/{total}")),
                json!(status),
                json!(restarts),
                age(obj, now),
                json!(or_none(s(p("/status/podIP")))),
                json!(or_none(s(p("/spec/nodeName")))),
                json!(or_none(s(p("/status/nominatedNodeName")))),
                json!("<none>"),
            ]
        }
        "Node" => {
            let conds = p("/status/conditions")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let mut status = match conds
                .iter()
                .find(|c| c.get("type") == Some(&json!("Ready")))
            {
                Some(c) if c.get("status") == Some(&json!("True")) => "Ready".to_string(),
                Some(c) if c.get("status") == Some(&json!("False")) => "NotReady".to_string(),
                _ => "Unknown".to_string(),
            };
            if p("/spec/unschedulable") == Some(&json!(true)) {
                status.push_str(",SchedulingDisabled");
            }
            let mut roles: Vec<String> = obj
                .pointer("/metadata/labels")
                .and_then(Value::as_object)
                .map(|l| {
                    l.keys()
                        .filter_map(|k| k.strip_prefix("node-role.kubernetes.io/"))
                        .map(String::from)
                        .collect()
                })
                .unwrap_or_default();
            roles.sort();
            let addr = |t: &str| {
                p("/status/addresses")
                    .and_then(Value::as_array)
                    .and_then(|a| a.iter().find(|x| x.get("type") == Some(&json!(t))))
                    .map(|x| s(x.get("address")))
                    .unwrap_or_default()
            };
            vec![
                name,
                json!(status),
                json!(or_none(roles.join(","))),
                age(obj, now),
                json!(s(p("/status/nodeInfo/kubeletVersion"))),
                json!(or_none(addr("InternalIP"))),
                json!(or_none(addr("ExternalIP"))),
            ]
        }
        "Namespace" => vec![name, json!(s(p("/status/phase"))), age(obj, now)],
        "Service" => {
            let ports = p("/spec/ports")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .map(|x| {
                            // kubectl's `port[:nodePort]/protocol`.
                            let node_port = x
                                .get("nodePort")
                                .and_then(Value::as_u64)
                                .map(|n| format!(":{n}"))
                                .unwrap_or_default();
                            format!(
                                "{}{node_port}/{}",
                                s(x.get("port")),
                                x.get("protocol").and_then(Value::as_str).unwrap_or("TCP")
                            )
                        })
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .unwrap_or_default();
            let selector = p("/spec/selector")
                .and_then(Value::as_object)
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .unwrap_or_default();
            vec![
                name,
                json!(s(p("/spec/type"))),
                json!(or_none(s(p("/spec/clusterIP")))),
                json!(external_ips(obj)),
                json!(or_none(ports)),
                age(obj, now),
                json!(or_none(selector)),
            ]
        }
        "ConfigMap" => {
            let n = p("/data").and_then(Value::as_object).map_or(0, |m| m.len())
                + p("/binaryData")
                    .and_then(Value::as_object)
                    .map_or(0, |m| m.len());
            vec![name, json!(n), age(obj, now)]
        }
        "Secret" => {
            let n = p("/data").and_then(Value::as_object).map_or(0, |m| m.len());
            vec![name, json!(s(p("/type"))), json!(n), age(obj, now)]
        }
        "ServiceAccount" => vec![
            name,
            json!(p("/secrets").and_then(Value::as_array).map_or(0, Vec::len)),
            age(obj, now),
        ],
        "Endpoints" => {
            let mut eps = Vec::new();
            for sub in p("/subsets")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
            {
                for a in sub
                    .get("addresses")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default()
                {
                    for port in sub
                        .get("ports")
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default()
                    {
                        eps.push(format!("{}:{}", s(a.get("ip")), s(port.get("port"))));
                    }
                }
            }
            vec![name, json!(or_none(eps.join(","))), age(obj, now)]
        }
        "NetworkPolicy" => vec![
            name,
            json!(or_none(selector_string(p("/spec/podSelector")))),
            age(obj, now),
        ],
        "EndpointSlice" => {
            let ports = p("/ports")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .map(|x| s(x.get("port")))
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .unwrap_or_default();
            let eps: Vec<String> = p("/endpoints")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .flat_map(|e| {
                            e.get("addresses")
                                .and_then(Value::as_array)
                                .cloned()
                                .unwrap_or_default()
                        })
                        .map(|x| s(Some(&x)))
                        .collect()
                })
                .unwrap_or_default();
            vec![
                name,
                json!(s(p("/addressType"))),
                json!(or_none(ports)),
                json!(or_none(eps.join(","))),
                age(obj, now),
            ]
        }
        "CustomResourceDefinition" => vec![name, json!(s(p("/metadata/creationTimestamp")))],
        _ => vec![name, age(obj, now)],
    }
}

/// One table row for `obj` (served in `api_version`).
pub fn row(def: &ResourceDef, obj: &Value, include: Include, now: i64) -> Value {
    let mut r = json!({"cells": cells(def, obj, now)});
    match include {
        Include::None => {}
        Include::Metadata => {
            r["object"] = json!({
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj.get("metadata").cloned().unwrap_or(json!({})),
            });
        }
        Include::Object => r["object"] = obj.clone(),
    }
    r
}

pub fn table(def: &ResourceDef, rows: Vec<Value>, metadata: Value) -> Value {
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata,
        "columnDefinitions": columns(def),
        "rows": rows,
    })
}

/// kubectl's EXTERNAL-IP column: load-balancer ingress and `externalIPs`, `<pending>` for a
/// LoadBalancer without either, else `<none>`.
fn external_ips(obj: &Value) -> String {
    let mut ips: Vec<String> = Vec::new();
    let strings = |v: Option<&Value>| -> Vec<String> {
        v.and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    };
    let is_lb = obj.pointer("/spec/type").and_then(Value::as_str) == Some("LoadBalancer");
    if is_lb {
        for i in obj
            .pointer("/status/loadBalancer/ingress")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default()
        {
            if let Some(ip) = i
                .get("ip")
                .or_else(|| i.get("hostname"))
                .and_then(Value::as_str)
            {
                ips.push(ip.to_string());
            }
        }
    }
    ips.extend(strings(obj.pointer("/spec/externalIPs")));
    if !ips.is_empty() {
        ips.join(",")
    } else if is_lb {
        "<pending>".to_string()
    } else {
        "<none>".to_string()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::resources::builtins;

    #[test]
    fn pod_row() {
        let defs = builtins();
        let pod_def = defs.iter().find(|d| d.kind == "Pod").unwrap();
        let p = json!({"metadata": {"name": "a", "namespace": "x", "creationTimestamp": util::rfc3339(1000)},
            "spec": {"containers": [{"name": "c"}], "nodeName": "n1"}, "status": {"phase": "Running", "podIP": "10.0.0.1",
            "containerStatuses": [{"ready": true, "restartCount": 2}]}});
        let r = row(pod_def, &p, Include::Metadata, 1300);
        assert_eq!(
            r["cells"],
            json!([
                "a", "1/1", "Running", 2, "5m", "10.0.0.1", "n1", "<none>", "<none>"
            ])
        );
        assert_eq!(r["object"]["metadata"]["namespace"], "x");
        assert_eq!(columns(pod_def).len(), r["cells"].as_array().unwrap().len());
        for d in &defs {
            assert_eq!(
                columns(d).len(),
                cells(d, &json!({}), 0).len(),
                "{}",
                d.kind
            );
        }
    }
}
