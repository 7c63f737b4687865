//! Helpers shared by the integration tests.
#![allow(dead_code, clippy::unwrap_used)]

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt;
use margay_apiserver::{ApiServer, ServerOptions};
use serde_json::Value;

pub fn server(opts: ServerOptions) -> ApiServer {
    ApiServer::start(opts).unwrap()
}

pub fn calico_server() -> ApiServer {
    server(ServerOptions {
        calico_crds: true,
        ..Default::default()
    })
}

/// A kube client configured from the server's kubeconfig (exactly what a user would do).
pub async fn kube_client(s: &ApiServer) -> kube::Client {
    let kc = kube::config::Kubeconfig::from_yaml(&s.kubeconfig_yaml()).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .unwrap();
    kube::Client::try_from(cfg).unwrap()
}

/// A kube client with a different bearer token.
pub async fn kube_client_with_token(s: &ApiServer, token: &str) -> kube::Client {
    let yaml = s.kubeconfig_yaml().replace(s.token(), token);
    let kc = kube::config::Kubeconfig::from_yaml(&yaml).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .unwrap();
    kube::Client::try_from(cfg).unwrap()
}

/// A raw request; returns status, content type and body.
pub async fn raw(
    client: &kube::Client,
    method: &str,
    path: &str,
    ct: Option<&str>,
    accept: Option<&str>,
    body: Vec<u8>,
) -> (u16, String, Bytes) {
    let mut b = http::Request::builder().method(method).uri(path);
    if let Some(ct) = ct {
        b = b.header("content-type", ct);
    }
    if let Some(a) = accept {
        b = b.header("accept", a);
    }
    let resp = client
        .send(b.body(kube::client::Body::from(body)).unwrap())
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let ct = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let body = tokio::time::timeout(Duration::from_secs(20), resp.into_body().collect())
        .await
        .unwrap()
        .unwrap()
        .to_bytes();
    (status, ct, body)
}

pub async fn raw_json(
    client: &kube::Client,
    method: &str,
    path: &str,
    ct: Option<&str>,
    body: Value,
) -> (u16, Value) {
    let bytes = if body.is_null() {
        vec![]
    } else {
        serde_json::to_vec(&body).unwrap()
    };
    let (code, _, b) = raw(client, method, path, ct, None, bytes).await;
    (code, serde_json::from_slice(&b).unwrap_or(Value::Null))
}

/// Reads a watch stream event by event.
pub struct WatchReader {
    body: kube::client::Body,
    buf: Vec<u8>,
    pub status: u16,
}

impl WatchReader {
    pub async fn open(client: &kube::Client, path: &str, accept: Option<&str>) -> WatchReader {
        let mut b = http::Request::builder().method("GET").uri(path);
        if let Some(a) = accept {
            b = b.header("accept", a);
        }
        let resp = client
            .send(b.body(kube::client::Body::from(Vec::new())).unwrap())
            .await
            .unwrap();
        let status = resp.status().as_u16();
        WatchReader {
            body: resp.into_body(),
            buf: Vec::new(),
            status,
        }
    }

    /// The next event, or None when the stream ended or nothing came within `wait`.
    pub async fn next(&mut self, wait: Duration) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            // Events are one JSON document each; split on the newline the server writes.
            if let Some(i) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                return Some(serde_json::from_slice(&line).unwrap());
            }
            let frame = tokio::time::timeout_at(deadline, self.body.frame())
                .await
                .ok()??;
            if let Ok(data) = frame.unwrap().into_data() {
                self.buf.extend_from_slice(&data);
            }
        }
    }

    /// Whether the server ended the stream within `wait`.
    pub async fn ended(&mut self, wait: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            match tokio::time::timeout_at(deadline, self.body.frame()).await {
                Ok(None) => return true,
                Ok(Some(Err(_))) => return true,
                Ok(Some(Ok(f))) => {
                    if let Ok(d) = f.into_data() {
                        self.buf.extend_from_slice(&d);
                    }
                }
                Err(_) => return false,
            }
        }
    }
}

/// Polls `f` until it returns true or `timeout` passes.
pub async fn eventually(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    f()
}

pub fn pod(name: &str, labels: Value) -> Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    })
}
