//! The thin HTTP layer: kube-rs requests for one API resource, objects as JSON values.
//!
//! Everything here is one API call (or one pager); what the objects mean is decided elsewhere.

use std::time::Duration;

use futures_util::{Stream, StreamExt};
use kube::core::params::{
    DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions, WatchParams,
};
use kube::core::{Request, WatchEvent};
use serde_json::Value;

use super::route::ApiResource;

/// Objects per page when listing (client-go's pager default).
pub const PAGE_SIZE: u32 = 500;
/// How long the server may keep one watch open before we re-watch (from the last
/// resourceVersion seen, so nothing is missed).
const WATCH_TIMEOUT_SECS: u32 = 290;
/// Full re-lists tried when a paginated list's continue token expires mid-way.
const MAX_LIST_RESTARTS: usize = 3;

/// What the API server said, reduced to what the datastore contract distinguishes.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApiError {
    #[error("not found")]
    NotFound,
    #[error("already exists")]
    AlreadyExists,
    /// A resourceVersion or UID precondition failed.
    #[error("conflict: {0}")]
    Conflict(String),
    /// 410: the resourceVersion asked for is older than the server's history.
    #[error("gone: {0}")]
    Gone(String),
    /// 401/403.
    #[error("{0}")]
    Denied(String),
    /// 400/415/422 and anything the server will not accept.
    #[error("{0}")]
    Rejected(String),
    /// The server could not be reached, or failed (5xx, 429, timeouts).
    #[error("{0}")]
    Unavailable(String),
}

impl ApiError {
    fn from_kube(e: kube::Error) -> ApiError {
        match e {
            kube::Error::Api(status) => {
                let msg = if status.message.is_empty() {
                    format!("{} ({})", status.reason, status.code)
                } else {
                    status.message.clone()
                };
                match status.code {
                    404 => ApiError::NotFound,
                    409 if status.reason == "AlreadyExists" => ApiError::AlreadyExists,
                    409 => ApiError::Conflict(msg),
                    410 => ApiError::Gone(msg),
                    401 => ApiError::Denied(format!(
                        "the API server refused the credentials (401 Unauthorized): {msg}; check the kubeconfig's token or certificate"
                    )),
                    403 => ApiError::Denied(format!(
                        "the API server forbids this (403 Forbidden): {msg}; check the RBAC rules of margay's service account"
                    )),
                    // 422 on a stale resourceVersion/UID precondition is a conflict (Calico's rule).
                    422 if msg.contains("metadata.resourceVersion") => ApiError::Conflict(msg),
                    400 | 405 | 413 | 415 | 422 => ApiError::Rejected(msg),
                    _ => ApiError::Unavailable(format!("API server error {}: {msg}", status.code)),
                }
            }
            kube::Error::SerdeError(e) => ApiError::Rejected(format!(
                "the API server's reply is not the JSON expected: {e}"
            )),
            other => ApiError::Unavailable(other.to_string()),
        }
    }
}

pub type ApiResult<T> = std::result::Result<T, ApiError>;

/// One page or a whole listing.
#[derive(Debug, Default)]
pub struct Listing {
    pub items: Vec<Value>,
    /// The listing's resourceVersion (of its first page).
    pub resource_version: String,
}

#[derive(Clone)]
pub struct KubeApi {
    client: kube::Client,
}

fn build(
    r: std::result::Result<http::Request<Vec<u8>>, kube::core::request::Error>,
) -> ApiResult<http::Request<Vec<u8>>> {
    r.map_err(|e| ApiError::Rejected(format!("cannot build the request: {e}")))
}

impl KubeApi {
    pub fn new(client: kube::Client) -> Self {
        KubeApi { client }
    }

    async fn call(&self, req: http::Request<Vec<u8>>) -> ApiResult<Value> {
        self.client
            .request::<Value>(req)
            .await
            .map_err(ApiError::from_kube)
    }

    pub async fn get(
        &self,
        res: &ApiResource,
        ns: Option<&str>,
        name: &str,
    ) -> ApiResult<Option<Value>> {
        let req = build(Request::new(res.collection_path(ns)).get(name, &Default::default()))?;
        match self.call(req).await {
            Ok(v) => Ok(Some(v)),
            Err(ApiError::NotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Every object (in a namespace, matching a label selector), paginated, as one listing at
    /// the resourceVersion of its first page. An expired continue token restarts the listing.
    pub async fn list_all(
        &self,
        res: &ApiResource,
        ns: Option<&str>,
        label_selector: Option<&str>,
    ) -> ApiResult<Listing> {
        let mut restarts = 0;
        'restart: loop {
            let mut out = Listing::default();
            let mut token: Option<String> = None;
            // Bounded: a server that hands out continue tokens forever is cut off.
            for _page in 0..1_000_000 {
                let mut lp = ListParams::default().limit(PAGE_SIZE);
                if let Some(s) = label_selector {
                    lp = lp.labels(s);
                }
                if let Some(t) = &token {
                    lp = lp.continue_token(t);
                }
                let req = build(Request::new(res.collection_path(ns)).list(&lp))?;
                let page = match self.call(req).await {
                    Ok(p) => p,
                    Err(ApiError::Gone(_)) if token.is_some() && restarts < MAX_LIST_RESTARTS => {
                        restarts += 1;
                        continue 'restart;
                    }
                    Err(e) => return Err(e),
                };
                let meta = page.get("metadata");
                if out.resource_version.is_empty() {
                    out.resource_version = meta
                        .and_then(|m| m.get("resourceVersion"))
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string();
                }
                token = meta
                    .and_then(|m| m.get("continue"))
                    .and_then(Value::as_str)
                    .filter(|t| !t.is_empty())
                    .map(str::to_string);
                if let Some(Value::Array(items)) = page.get("items").cloned() {
                    out.items.extend(items);
                }
                if token.is_none() {
                    return Ok(out);
                }
            }
            return Err(ApiError::Unavailable(format!(
                "listing {} did not end after a million pages",
                res.display()
            )));
        }
    }

    /// The current resourceVersion of `res` (a one-object list).
    pub async fn current_revision(&self, res: &ApiResource) -> ApiResult<String> {
        let req =
            build(Request::new(res.collection_path(None)).list(&ListParams::default().limit(1)))?;
        let page = self.call(req).await?;
        Ok(page
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string())
    }

    pub async fn create(
        &self,
        res: &ApiResource,
        ns: Option<&str>,
        body: &Value,
    ) -> ApiResult<Value> {
        let data = serde_json::to_vec(body).map_err(|e| ApiError::Rejected(e.to_string()))?;
        let req =
            build(Request::new(res.collection_path(ns)).create(&PostParams::default(), data))?;
        self.call(req).await
    }

    /// PUT; `body.metadata.resourceVersion` is the precondition.
    pub async fn replace(
        &self,
        res: &ApiResource,
        ns: Option<&str>,
        name: &str,
        body: &Value,
    ) -> ApiResult<Value> {
        let data = serde_json::to_vec(body).map_err(|e| ApiError::Rejected(e.to_string()))?;
        let req = build(Request::new(res.collection_path(ns)).replace(
            name,
            &PostParams::default(),
            data,
        ))?;
        self.call(req).await
    }

    /// A JSON merge patch, on the object or one of its subresources (`status`). A
    /// `metadata.resourceVersion` in the patch is a precondition.
    pub async fn merge_patch(
        &self,
        res: &ApiResource,
        ns: Option<&str>,
        name: &str,
        subresource: Option<&str>,
        patch: &Value,
    ) -> ApiResult<Value> {
        let pp = PatchParams::default();
        let p = Patch::Merge(patch);
        let r = Request::new(res.collection_path(ns));
        let req = match subresource {
            Some(sub) => build(r.patch_subresource(sub, name, &pp, &p))?,
            None => build(r.patch(name, &pp, &p))?,
        };
        self.call(req).await
    }

    /// DELETE, conditional on the resourceVersion when given. The reply is the deleted object
    /// (or, from some servers, a Status, in which case None).
    pub async fn delete(
        &self,
        res: &ApiResource,
        ns: Option<&str>,
        name: &str,
        resource_version: Option<String>,
    ) -> ApiResult<Option<Value>> {
        let mut dp = DeleteParams::background();
        if let Some(rv) = resource_version {
            dp = dp.preconditions(Preconditions {
                resource_version: Some(rv),
                uid: None,
            });
        }
        let req = build(Request::new(res.collection_path(ns)).delete(name, &dp))?;
        let v = self.call(req).await?;
        Ok((v.get("kind").and_then(Value::as_str) != Some("Status")).then_some(v))
    }

    /// One watch request from `resource_version`, with bookmarks. The stream ends when the
    /// server ends it (its timeout, or a restart); callers re-watch from the last version.
    pub async fn watch(
        &self,
        res: &ApiResource,
        ns: Option<&str>,
        label_selector: Option<&str>,
        resource_version: &str,
    ) -> ApiResult<impl Stream<Item = ApiResult<WatchEvent<Value>>> + Send + use<>> {
        let mut wp = WatchParams::default().timeout(WATCH_TIMEOUT_SECS);
        if let Some(s) = label_selector {
            wp = wp.labels(s);
        }
        let req = build(Request::new(res.collection_path(ns)).watch(&wp, resource_version))?;
        let stream = self
            .client
            .request_events::<Value>(req)
            .await
            .map_err(ApiError::from_kube)?;
        Ok(stream
            .map(|item: Result<WatchEvent<Value>, kube::Error>| item.map_err(ApiError::from_kube))
            .boxed())
    }

    /// Pause between retries of a failed call.
    pub fn backoff(attempt: u32) -> Duration {
        Duration::from_millis(200u64.saturating_mul(1 << attempt.min(6)))
            .min(Duration::from_secs(10))
    }
}

/// `metadata.resourceVersion` of an object.
pub fn resource_version(obj: &Value) -> Option<&str> {
    obj.pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
}

/// Parses a resourceVersion as margay's revision number.
pub fn parse_revision(rv: &str) -> Option<i64> {
    rv.parse::<i64>().ok().filter(|r| *r >= 0)
}
