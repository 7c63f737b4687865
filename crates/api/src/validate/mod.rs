//! Validation: every rule a resource must satisfy before anything stores or uses it.
//!
//! Validation walks the typed resource and collects every problem (it does not stop at the
//! first), each with the path of the offending field and the rule it breaks:
//! `spec.cidr: "10.0.0.0/33" is not a valid CIDR: prefix length /33 exceeds /32`.
//! Paths are built lazily (only when an error is reported), so validating a valid resource
//! allocates nothing for paths.

mod bgp;
mod endpoint;
mod felix;
mod ipam;
mod meta;
mod policy;
pub(crate) mod syntax;

use std::fmt;

use crate::duration::Duration;
use crate::resource::Resource;

/// One broken rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Dotted path of the field, e.g. `spec.ingress[0].destination.ports[1]`.
    pub path: String,
    /// What is wrong and, where it helps, what would be right.
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Every problem found in one resource.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ValidationErrors(pub Vec<FieldError>);

impl ValidationErrors {
    pub fn iter(&self) -> impl Iterator<Item = &FieldError> {
        self.0.iter()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

/// Validates any resource.
pub fn validate_resource(resource: &Resource) -> Result<(), ValidationErrors> {
    let mut v = Validator::default();
    let root = Path::ROOT;
    meta::check_type_meta(&mut v, resource);
    meta::check_metadata(
        &mut v,
        root.field("metadata"),
        resource.kind(),
        resource.metadata(),
    );
    let spec = root.field("spec");
    match resource {
        Resource::BGPConfiguration(r) => {
            bgp::bgp_configuration(&mut v, spec, &r.metadata.name, &r.spec)
        }
        Resource::BGPFilter(r) => bgp::bgp_filter(&mut v, spec, &r.spec),
        Resource::BGPPeer(r) => bgp::bgp_peer(&mut v, spec, &r.spec),
        Resource::ClusterInformation(r) => ipam::cluster_information(&mut v, spec, &r.spec),
        Resource::FelixConfiguration(r) => {
            felix::felix_configuration(&mut v, spec, &r.metadata.name, &r.spec)
        }
        Resource::GlobalNetworkPolicy(r) => policy::global_network_policy(&mut v, spec, &r.spec),
        Resource::GlobalNetworkSet(r) => policy::network_set(&mut v, spec, &r.spec),
        Resource::HostEndpoint(r) => endpoint::host_endpoint(&mut v, spec, &r.spec),
        Resource::IPAMConfiguration(r) => ipam::ipam_configuration(&mut v, spec, &r.spec),
        Resource::IPPool(r) => ipam::ip_pool(&mut v, spec, &r.spec),
        Resource::IPReservation(r) => ipam::ip_reservation(&mut v, spec, &r.spec),
        Resource::KubeControllersConfiguration(r) => {
            ipam::kube_controllers_configuration(&mut v, spec, &r.spec)
        }
        Resource::NetworkPolicy(r) => policy::network_policy(&mut v, spec, &r.spec),
        Resource::NetworkSet(r) => policy::network_set(&mut v, spec, &r.spec),
        Resource::Node(r) => {
            endpoint::node(&mut v, spec, &r.spec);
            if let Some(status) = &r.status {
                endpoint::node_status(&mut v, root.field("status"), status);
            }
        }
        Resource::Profile(r) => policy::profile(&mut v, spec, &r.spec),
        Resource::Tier(r) => policy::tier(&mut v, spec, &r.metadata.name, &r.spec),
        Resource::WorkloadEndpoint(r) => endpoint::workload_endpoint(
            &mut v,
            spec,
            root.field("metadata").field("name"),
            &r.metadata.name,
            &r.spec,
        ),
    }
    v.finish()
}

/// A field path, built on the stack as validation descends and rendered only on error.
#[derive(Clone, Copy)]
pub(crate) struct Path<'a> {
    parent: Option<&'a Path<'a>>,
    segment: Segment<'a>,
}

#[derive(Clone, Copy)]
enum Segment<'a> {
    Root,
    Field(&'a str),
    Index(usize),
    Key(&'a str),
}

impl<'a> Path<'a> {
    pub(crate) const ROOT: Path<'static> = Path {
        parent: None,
        segment: Segment::Root,
    };

    pub(crate) fn field(&'a self, name: &'a str) -> Path<'a> {
        Path {
            parent: Some(self),
            segment: Segment::Field(name),
        }
    }

    pub(crate) fn index(&'a self, i: usize) -> Path<'a> {
        Path {
            parent: Some(self),
            segment: Segment::Index(i),
        }
    }

    pub(crate) fn key(&'a self, key: &'a str) -> Path<'a> {
        Path {
            parent: Some(self),
            segment: Segment::Key(key),
        }
    }

    pub(crate) fn render(&self) -> String {
        let mut segments = Vec::new();
        let mut cur = Some(self);
        while let Some(p) = cur {
            segments.push(p.segment);
            cur = p.parent;
        }
        let mut out = String::new();
        for seg in segments.iter().rev() {
            match seg {
                Segment::Root => {}
                Segment::Field(name) => {
                    if !out.is_empty() {
                        out.push('.');
                    }
                    out.push_str(name);
                }
                Segment::Index(i) => out.push_str(&format!("[{i}]")),
                Segment::Key(k) => out.push_str(&format!("[{k:?}]")),
            }
        }
        if out.is_empty() {
            out.push_str("<resource>");
        }
        out
    }
}

/// Collects errors.
#[derive(Default)]
pub(crate) struct Validator {
    errors: Vec<FieldError>,
}

impl Validator {
    pub(crate) fn err(&mut self, path: Path<'_>, message: impl Into<String>) {
        self.errors.push(FieldError {
            path: path.render(),
            message: message.into(),
        });
    }

    fn finish(self) -> Result<(), ValidationErrors> {
        if self.errors.is_empty() {
            Ok(())
        } else {
            Err(ValidationErrors(self.errors))
        }
    }

    /// An exact-match enumeration.
    pub(crate) fn one_of(&mut self, value: Option<&str>, path: Path<'_>, allowed: &[&str]) {
        if let Some(v) = value
            && !allowed.contains(&v)
        {
            self.err(path, format!("{v:?} is not one of {}", list(allowed)));
        }
    }

    /// A case-insensitive enumeration (Calico's `(?i)` patterns); empty means unset.
    pub(crate) fn one_of_ci(&mut self, value: Option<&str>, path: Path<'_>, allowed: &[&str]) {
        if let Some(v) = value
            && !v.is_empty()
            && !allowed.iter().any(|a| a.eq_ignore_ascii_case(v))
        {
            self.err(
                path,
                format!("{v:?} is not one of {} (case-insensitive)", list(allowed)),
            );
        }
    }

    pub(crate) fn duration(&mut self, value: &Option<Duration>, path: Path<'_>) {
        if let Some(d) = value {
            self.duration_value(d, path);
        }
    }

    pub(crate) fn duration_value(&mut self, d: &Duration, path: Path<'_>) {
        match d.nanos() {
            Ok(n) if n < 0 => self.err(
                path,
                format!("duration {:?} must not be negative", d.as_str()),
            ),
            Ok(_) => {}
            Err(e) => self.err(path, e),
        }
    }

    pub(crate) fn range(&mut self, value: Option<i64>, path: Path<'_>, lo: i64, hi: i64) {
        if let Some(n) = value
            && (n < lo || n > hi)
        {
            let msg = match (lo, hi) {
                (i64::MIN, hi) => format!("{n} is out of range (must be at most {hi})"),
                (lo, i64::MAX) => format!("{n} is out of range (must be at least {lo})"),
                (lo, hi) => format!("{n} is out of range ({lo}-{hi})"),
            };
            self.err(path, msg);
        }
    }

    pub(crate) fn regex(&mut self, value: Option<&str>, path: Path<'_>) {
        if let Some(r) = value
            && let Err(e) = regex_syntax::Parser::new().parse(r)
        {
            let detail = e.to_string();
            let last = detail.lines().last().unwrap_or("").trim();
            self.err(
                path,
                format!("{r:?} is not a valid regular expression: {last}"),
            );
        }
    }

    pub(crate) fn interface_name(&mut self, value: Option<&str>, path: Path<'_>) {
        if let Some(name) = value
            && !name.is_empty()
            && !syntax::is_interface_name(name)
        {
            self.err(path, syntax::interface_name_message(name));
        }
    }

    pub(crate) fn cidr_list(&mut self, value: Option<&[String]>, path: Path<'_>) {
        for (i, c) in value.unwrap_or_default().iter().enumerate() {
            if let Err(e) = crate::net::Cidr::parse_cidr_or_ip(c) {
                self.err(path.index(i), e);
            }
        }
    }

    pub(crate) fn key_value_list(&mut self, value: Option<&str>, path: Path<'_>) {
        let Some(text) = value else { return };
        for item in text.split(',') {
            if item.is_empty() {
                continue;
            }
            let ok = item.trim_start().split_once('=').is_some_and(|(k, _)| {
                !k.is_empty() && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            });
            if !ok {
                self.err(
                    path,
                    format!(
                        "{item:?} is not a key=value pair (expected e.g. \"Foo=true,Bar=false\")"
                    ),
                );
                return;
            }
        }
    }

    /// `Feature=true|false|` pairs (empty means "detect").
    pub(crate) fn feature_detect_override(&mut self, value: Option<&str>, path: Path<'_>) {
        self.key_value_list(value, path);
        let Some(text) = value else { return };
        for item in text.split(',').filter(|i| !i.is_empty()) {
            if let Some((_, val)) = item.split_once('=')
                && !matches!(val, "true" | "false" | "")
            {
                self.err(
                    path,
                    format!("{item:?}: override values are true, false or empty (to auto-detect)"),
                );
                return;
            }
        }
    }

    pub(crate) fn prometheus_host(&mut self, value: Option<&str>, path: Path<'_>) {
        if let Some(h) = value
            && !h.is_empty()
            && !(h.len() <= 64
                && h.bytes().all(|b| {
                    b.is_ascii_alphanumeric() || matches!(b, b':' | b'.' | b'_' | b'+' | b'-')
                }))
        {
            self.err(path, format!("{h:?} is not a valid host name or address"));
        }
    }

    /// A non-empty selector must parse.
    pub(crate) fn selector(&mut self, value: &str, path: Path<'_>) {
        if value.is_empty() {
            return;
        }
        if value.len() > 1024 {
            self.err(
                path,
                format!("selector is {} characters long (max 1024)", value.len()),
            );
            return;
        }
        if let Err(e) = margay_selector::Selector::parse(value) {
            self.err(path, e.to_string());
        }
    }

    /// Selectors other than an EntityRule's namespaceSelector must not use global().
    pub(crate) fn selector_without_global(&mut self, value: &str, path: Path<'_>, what: &str) {
        if value.contains("global(") {
            self.err(
                path,
                format!("global() can only be used in a rule's namespaceSelector, not in {what}"),
            );
        } else {
            self.selector(value, path);
        }
    }

    pub(crate) fn ip(&mut self, value: &str, path: Path<'_>, version: Option<u8>) {
        if value.is_empty() {
            return;
        }
        match value.parse::<std::net::IpAddr>() {
            Ok(ip) => {
                let v = if ip.is_ipv4() { 4 } else { 6 };
                if let Some(want) = version
                    && want != v
                {
                    self.err(path, format!("{value:?} is not an IPv{want} address"));
                }
            }
            Err(_) => self.err(
                path,
                match version {
                    Some(want) => format!("{value:?} is not a valid IPv{want} address"),
                    None => format!("{value:?} is not a valid IP address"),
                },
            ),
        }
    }

    /// A CIDR or bare address whose host bits are clear (Calico's `net` rule), optionally of
    /// one family.
    pub(crate) fn network(&mut self, value: &str, path: Path<'_>, version: Option<u8>) {
        match crate::net::Cidr::parse_cidr_or_ip(value) {
            Ok(c) => {
                if let Some(want) = version
                    && c.version() != want
                {
                    self.err(path, format!("{value:?} is not an IPv{want} network"));
                } else if !c.is_masked() {
                    self.err(
                        path,
                        format!(
                            "{value:?} has host bits set (did you mean {}?)",
                            c.network()
                        ),
                    );
                }
            }
            Err(e) => self.err(path, e),
        }
    }

    pub(crate) fn dns_name(&mut self, value: &str, path: Path<'_>) {
        if !value.is_empty()
            && let Err(e) = syntax::dns1123_subdomain(value)
        {
            self.err(path, e);
        }
    }

    pub(crate) fn labels(
        &mut self,
        labels: &std::collections::BTreeMap<String, String>,
        path: Path<'_>,
    ) {
        for (k, val) in labels {
            let p = path.key(k);
            if let Err(e) = syntax::qualified_name(k) {
                self.err(p, format!("label key {k:?} is invalid: {e}"));
            }
            if let Err(e) = syntax::label_value(val) {
                self.err(p, format!("label value {val:?} is invalid: {e}"));
            }
        }
    }
}

fn list(allowed: &[&str]) -> String {
    allowed
        .iter()
        .map(|a| format!("{a:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}
