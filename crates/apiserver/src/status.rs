//! `Status` errors as the real API server words them (kubectl prints `message`, clients branch
//! on `reason` and `code`).

use serde_json::{Value, json};

/// An API error: becomes a `Status` object with HTTP code `code`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{reason} ({code}): {message}")]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
    /// Seconds for a `Retry-After` header (429 and 503).
    pub retry_after: Option<u32>,
}

/// The names an error message needs: `pods` or `ippools.crd.projectcalico.org`, the group and
/// the Kind.
#[derive(Debug, Clone)]
pub struct ErrCtx<'a> {
    pub group: &'a str,
    pub plural: &'a str,
    pub kind: &'a str,
}

impl ErrCtx<'_> {
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }
    fn qualified_kind(&self) -> String {
        if self.group.is_empty() {
            self.kind.to_string()
        } else {
            format!("{}.{}", self.kind, self.group)
        }
    }
    fn details(&self, name: &str) -> Value {
        let mut d = json!({"name": name, "kind": self.plural});
        if !self.group.is_empty() {
            d["group"] = json!(self.group);
        }
        d
    }
}

/// One field error of a 422 Invalid.
#[derive(Debug, Clone)]
pub struct Cause {
    pub reason: &'static str,
    pub field: String,
    pub message: String,
}

impl Cause {
    pub fn required(field: impl Into<String>, detail: &str) -> Cause {
        let message = if detail.is_empty() {
            "Required value".to_string()
        } else {
            format!("Required value: {detail}")
        };
        Cause {
            reason: "FieldValueRequired",
            field: field.into(),
            message,
        }
    }
    pub fn invalid(field: impl Into<String>, value: &str, detail: &str) -> Cause {
        Cause {
            reason: "FieldValueInvalid",
            field: field.into(),
            message: format!("Invalid value: \"{value}\": {detail}"),
        }
    }
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
            retry_after: None,
        }
    }

    pub fn not_found(c: &ErrCtx, name: &str) -> ApiError {
        ApiError {
            details: Some(c.details(name)),
            ..ApiError::new(
                404,
                "NotFound",
                format!("{} \"{name}\" not found", c.qualified()),
            )
        }
    }

    pub fn namespace_not_found(ns: &str) -> ApiError {
        ApiError::not_found(
            &ErrCtx {
                group: "",
                plural: "namespaces",
                kind: "Namespace",
            },
            ns,
        )
    }

    pub fn already_exists(c: &ErrCtx, name: &str) -> ApiError {
        ApiError {
            details: Some(c.details(name)),
            ..ApiError::new(
                409,
                "AlreadyExists",
                format!("{} \"{name}\" already exists", c.qualified()),
            )
        }
    }

    /// 409 Conflict: `Operation cannot be fulfilled on <qualified> "<name>": <why>`.
    pub fn conflict(c: &ErrCtx, name: &str, why: &str) -> ApiError {
        ApiError {
            details: Some(c.details(name)),
            ..ApiError::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} \"{name}\": {why}",
                    c.qualified()
                ),
            )
        }
    }

    /// The stale-write conflict.
    pub fn modified(c: &ErrCtx, name: &str) -> ApiError {
        ApiError::conflict(
            c,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    pub fn invalid(c: &ErrCtx, name: &str, causes: Vec<Cause>) -> ApiError {
        let list: Vec<String> = causes
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect();
        let joined = if list.len() == 1 {
            list[0].clone()
        } else {
            format!("[{}]", list.join(", "))
        };
        let mut details = json!({
            "name": name,
            "kind": c.kind,
            "causes": causes.iter().map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field})).collect::<Vec<_>>(),
        });
        if !c.group.is_empty() {
            details["group"] = json!(c.group);
        }
        ApiError {
            details: Some(details),
            ..ApiError::new(
                422,
                "Invalid",
                format!("{} \"{name}\" is invalid: {joined}", c.qualified_kind()),
            )
        }
    }

    pub fn bad_request(msg: impl Into<String>) -> ApiError {
        ApiError::new(400, "BadRequest", msg)
    }

    pub fn method_not_allowed(msg: impl Into<String>) -> ApiError {
        ApiError::new(405, "MethodNotAllowed", msg)
    }

    pub fn unsupported_media_type(msg: impl Into<String>) -> ApiError {
        ApiError::new(415, "UnsupportedMediaType", msg)
    }

    /// 410 Expired: a resourceVersion or continue token older than the retained history.
    pub fn expired(msg: impl Into<String>) -> ApiError {
        ApiError::new(410, "Expired", msg)
    }

    pub fn too_old(rv: u64, oldest: u64) -> ApiError {
        ApiError::expired(format!("too old resource version: {rv} ({oldest})"))
    }

    pub fn unauthorized() -> ApiError {
        ApiError::new(401, "Unauthorized", "Unauthorized")
    }

    pub fn too_large(limit: usize) -> ApiError {
        ApiError::new(
            413,
            "RequestEntityTooLarge",
            format!("Request entity too large: limit is {limit}"),
        )
    }

    pub fn internal(msg: impl Into<String>) -> ApiError {
        ApiError::new(500, "InternalError", msg)
    }

    /// The reason the real server uses for an HTTP code (for injected faults).
    pub fn for_code(code: u16, msg: Option<String>) -> ApiError {
        let (reason, default): (&'static str, &str) = match code {
            400 => ("BadRequest", "bad request"),
            401 => ("Unauthorized", "Unauthorized"),
            403 => ("Forbidden", "forbidden"),
            404 => (
                "NotFound",
                "the server could not find the requested resource",
            ),
            405 => (
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
            ),
            409 => (
                "Conflict",
                "the object has been modified; please apply your changes to the latest version and try again",
            ),
            410 => ("Expired", "too old resource version"),
            415 => ("UnsupportedMediaType", "unsupported media type"),
            422 => ("Invalid", "invalid"),
            429 => (
                "TooManyRequests",
                "Too many requests, please try again later.",
            ),
            500 => ("InternalError", "Internal error occurred: injected fault"),
            503 => (
                "ServiceUnavailable",
                "the server is currently unable to handle the request",
            ),
            504 => (
                "Timeout",
                "the server was unable to return a response in the time allotted",
            ),
            _ => ("", "injected fault"),
        };
        let mut e = ApiError::new(code, reason, msg.unwrap_or_else(|| default.to_string()));
        if code == 429 || code == 503 {
            e.retry_after = Some(1);
        }
        e
    }

    /// The `Status` object.
    pub fn to_status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if self.reason.is_empty()
            && let Some(m) = s.as_object_mut()
        {
            m.remove("reason");
        }
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        if let Some(r) = self.retry_after {
            let d = s.get("details").cloned().unwrap_or_else(|| json!({}));
            let mut d = d;
            d["retryAfterSeconds"] = json!(r);
            s["details"] = d;
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wording_matches_the_real_server() {
        let pods = ErrCtx {
            group: "",
            plural: "pods",
            kind: "Pod",
        };
        let pools = ErrCtx {
            group: "crd.projectcalico.org",
            plural: "ippools",
            kind: "IPPool",
        };
        assert_eq!(
            ApiError::not_found(&pods, "nope").message,
            "pods \"nope\" not found"
        );
        assert_eq!(
            ApiError::not_found(&pools, "p").message,
            "ippools.crd.projectcalico.org \"p\" not found"
        );
        assert_eq!(
            ApiError::already_exists(&pods, "p1").to_status(),
            json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"pods \"p1\" already exists","reason":"AlreadyExists","details":{"name":"p1","kind":"pods"},"code":409})
        );
        assert_eq!(
            ApiError::modified(&pods, "p3").message,
            "Operation cannot be fulfilled on pods \"p3\": the object has been modified; please apply your changes to the latest version and try again"
        );
        let inv = ApiError::invalid(
            &pods,
            "p4",
            vec![Cause::required("spec.containers[0].image", "")],
        );
        assert_eq!(
            inv.message,
            "Pod \"p4\" is invalid: spec.containers[0].image: Required value"
        );
        assert_eq!(
            inv.to_status()["details"]["causes"][0]["reason"],
            "FieldValueRequired"
        );
        let inv = ApiError::invalid(
            &pools,
            "x",
            vec![Cause::required("a", ""), Cause::required("b", "")],
        );
        assert_eq!(
            inv.message,
            "IPPool.crd.projectcalico.org \"x\" is invalid: [a: Required value, b: Required value]"
        );
        assert_eq!(
            ApiError::for_code(429, None).to_status()["details"]["retryAfterSeconds"],
            1
        );
    }
}
