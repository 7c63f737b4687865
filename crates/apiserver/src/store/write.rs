//! Writes: validation, create, update, patch and delete (with finalizers and graceful pod
//! deletion), each committed as one event.

use super::*;

impl State {
    pub(super) fn validate(
        &self,
        def: &ResourceDef,
        obj: &Value,
        name: &str,
    ) -> Result<(), ApiError> {
        let mut causes = Vec::new();
        let name_ok = match def.kind.as_str() {
            "Namespace" => util::is_dns1123_label(name),
            "Service" => util::is_dns1035_label(name),
            _ => util::is_dns1123_subdomain(name),
        };
        if !name_ok {
            let what = match def.kind.as_str() {
                "Namespace" => {
                    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character"
                }
                "Service" => {
                    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character"
                }
                _ => {
                    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
                }
            };
            causes.push(Cause::invalid("metadata.name", name, what));
        }
        if let Some(labels) = meta(obj).and_then(|m| m.get("labels")) {
            match labels.as_object() {
                Some(l) => {
                    for (k, v) in l {
                        if !crate::selector::valid_label_key(k) {
                            causes.push(Cause::invalid("metadata.labels", k, "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"));
                        }
                        match v.as_str() {
                            Some(s) if crate::selector::valid_label_value(s) => {}
                            _ => causes.push(Cause::invalid("metadata.labels".to_string(), &v.to_string(), "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character")),
                        }
                    }
                }
                None if labels.is_null() => {}
                None => causes.push(Cause::invalid(
                    "metadata.labels",
                    "",
                    "must be a map of strings",
                )),
            }
        }
        if let Some(a) = meta(obj).and_then(|m| m.get("annotations"))
            && !a.is_null()
            && !a
                .as_object()
                .is_some_and(|m| m.values().all(Value::is_string))
        {
            causes.push(Cause::invalid(
                "metadata.annotations",
                "",
                "must be a map of strings",
            ));
        }
        match def.kind.as_str() {
            "Pod" if def.builtin => {
                let containers = obj.pointer("/spec/containers").and_then(Value::as_array);
                match containers {
                    None => causes.push(Cause::required("spec.containers", "")),
                    Some(cs) if cs.is_empty() => {
                        causes.push(Cause::required("spec.containers", ""))
                    }
                    Some(cs) => {
                        for (i, c) in cs.iter().enumerate() {
                            if c.get("name")
                                .and_then(Value::as_str)
                                .unwrap_or("")
                                .is_empty()
                            {
                                causes.push(Cause::required(
                                    format!("spec.containers[{i}].name"),
                                    "",
                                ));
                            }
                            if c.get("image")
                                .and_then(Value::as_str)
                                .unwrap_or("")
                                .is_empty()
                            {
                                causes.push(Cause::required(
                                    format!("spec.containers[{i}].image"),
                                    "",
                                ));
                            }
                        }
                    }
                }
            }
            "CustomResourceDefinition" if def.builtin => {
                if let Err(c) = crd_to_def(obj) {
                    causes.extend(c);
                }
            }
            _ => {}
        }
        if causes.is_empty() {
            Ok(())
        } else {
            Err(ApiError::invalid(&def.ctx(), name, causes))
        }
    }

    /// The defaults and status resets the real server's create strategies apply.
    pub(super) fn prepare_create(
        &mut self,
        def: &ResourceDef,
        obj: &mut Value,
        name: &str,
        keep_status: bool,
    ) {
        if def.status
            && !keep_status
            && def.kind != "Node"
            && let Some(m) = obj.as_object_mut()
        {
            m.remove("status");
        }
        if !def.builtin {
            return;
        }
        match def.kind.as_str() {
            "Namespace" => {
                let m = meta_mut(obj);
                let labels = m.entry("labels").or_insert_with(|| json!({}));
                if labels.is_object() {
                    labels["kubernetes.io/metadata.name"] = json!(name);
                }
                obj["spec"] = json!({"finalizers": ["kubernetes"]});
                obj["status"] = json!({"phase": "Active"});
            }
            "Pod" => {
                if obj.pointer("/status/phase").is_none() {
                    if !obj.get("status").is_some_and(Value::is_object) {
                        obj["status"] = json!({});
                    }
                    obj["status"]["phase"] = json!("Pending");
                }
                if let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) {
                    spec.entry("restartPolicy").or_insert(json!("Always"));
                    spec.entry("dnsPolicy").or_insert(json!("ClusterFirst"));
                    spec.entry("schedulerName")
                        .or_insert(json!("default-scheduler"));
                    spec.entry("terminationGracePeriodSeconds")
                        .or_insert(json!(30));
                }
            }
            "Service" => {
                if let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) {
                    let ty = spec
                        .entry("type")
                        .or_insert(json!("ClusterIP"))
                        .as_str()
                        .unwrap_or("")
                        .to_string();
                    spec.entry("sessionAffinity").or_insert(json!("None"));
                    // ClusterIPs and NodePorts were allocated by `create` (services.rs).
                    let _ = ty;
                    if let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
                        for p in ports {
                            if let Some(pm) = p.as_object_mut() {
                                pm.entry("protocol").or_insert(json!("TCP"));
                                if let Some(port) = pm.get("port").cloned() {
                                    pm.entry("targetPort").or_insert(port);
                                }
                            }
                        }
                    }
                }
                if obj.get("status").is_none() {
                    obj["status"] = json!({"loadBalancer": {}});
                }
            }
            "CustomResourceDefinition" => {
                let names = obj.pointer("/spec/names").cloned().unwrap_or(json!({}));
                let stored: Vec<Value> = obj
                    .pointer("/spec/versions")
                    .and_then(Value::as_array)
                    .map(|vs| {
                        vs.iter()
                            .filter(|v| v.get("storage") == Some(&json!(true)))
                            .filter_map(|v| v.get("name").cloned())
                            .collect()
                    })
                    .unwrap_or_default();
                let now = util::rfc3339(util::now_secs());
                obj["status"] = json!({
                    "acceptedNames": names,
                    "storedVersions": stored,
                    "conditions": [
                        {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": now},
                        {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": now},
                    ],
                });
            }
            _ => {}
        }
    }

    /// POST: a new object (201 on success).
    pub fn create(
        &mut self,
        key: &str,
        ns: &str,
        mut obj: Value,
        opts: &WriteOpts,
    ) -> Result<Obj, ApiError> {
        let def = self.def(key)?;
        let version = if opts.version.is_empty() {
            def.version().to_string()
        } else {
            opts.version.clone()
        };
        Self::normalize_type(&def, &version, &mut obj)?;
        let m = meta_mut(&mut obj);
        if def.namespaced {
            match m.get("namespace").and_then(Value::as_str) {
                None | Some("") => {
                    m.insert("namespace".into(), json!(ns));
                }
                Some(x) if x == ns => {}
                Some(_) => {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ));
                }
            }
        } else {
            m.remove("namespace");
        }
        let mut name = m
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if name.is_empty() {
            let gen_name = m
                .get("generateName")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            if gen_name.is_empty() {
                return Err(ApiError::invalid(
                    &def.ctx(),
                    "",
                    vec![Cause::required(
                        "metadata.name",
                        "name or generateName is required",
                    )],
                ));
            }
            name = format!("{gen_name}{}", util::name_suffix());
            m.insert("name".into(), json!(name));
        }
        for f in [
            "uid",
            "resourceVersion",
            "selfLink",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "managedFields",
            "creationTimestamp",
        ] {
            m.remove(f);
        }
        m.insert("uid".into(), json!(util::uuid_v4()));
        m.insert(
            "creationTimestamp".into(),
            json!(util::rfc3339(util::now_secs())),
        );
        if def.has_generation() {
            m.insert("generation".into(), json!(1));
        } else {
            m.remove("generation");
        }
        if def.namespaced && !self.namespace_exists(ns) {
            return Err(ApiError::namespace_not_found(ns));
        }
        self.validate(&def, &obj, &name)?;
        let k = (
            if def.namespaced {
                ns.to_string()
            } else {
                String::new()
            },
            name.clone(),
        );
        if self
            .resources
            .get(key)
            .is_some_and(|c| c.objects.contains_key(&k))
        {
            return Err(ApiError::already_exists(&def.ctx(), &name));
        }
        if def.builtin && def.kind == "Service" {
            self.services
                .allocate(&mut obj)
                .map_err(|c| ApiError::invalid(&def.ctx(), &name, c))?;
        }
        self.prepare_create(&def, &mut obj, &name, opts.keep_status);
        let new_def = if def.kind == "CustomResourceDefinition" && def.builtin {
            let nd = crd_to_def(&obj).map_err(|c| ApiError::invalid(&def.ctx(), &name, c))?;
            if self.resources.get(&nd.key()).is_some_and(|c| c.def.builtin) {
                return Err(ApiError::invalid(
                    &def.ctx(),
                    &name,
                    vec![Cause::invalid(
                        "spec.names.plural",
                        &nd.plural,
                        "is already served by a built-in resource",
                    )],
                ));
            }
            Some(nd)
        } else {
            None
        };
        if opts.dry_run {
            return Ok(Stored::new(obj, self.rv));
        }
        let out = self.commit(key, &k.0, &k.1, EventType::Added, obj, None);
        if let Some(nd) = new_def {
            self.register(nd);
        }
        Ok(out)
    }

    /// PUT (and the second half of PATCH): replaces an object, subject to preconditions.
    #[allow(clippy::too_many_arguments)]
    pub fn update(
        &mut self,
        key: &str,
        ns: &str,
        name: &str,
        mut obj: Value,
        sub: Sub,
        opts: &WriteOpts,
        from_patch: bool,
    ) -> Result<Obj, ApiError> {
        let def = self.def(key)?;
        let old = self.get(key, ns, name)?;
        let version = if opts.version.is_empty() {
            def.version().to_string()
        } else {
            opts.version.clone()
        };
        Self::normalize_type(&def, &version, &mut obj)?;
        let body_name = meta_str(&obj, "name").to_string();
        if body_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        if def.namespaced {
            let bns = meta_str(&obj, "namespace").to_string();
            if bns.is_empty() {
                meta_mut(&mut obj).insert("namespace".into(), json!(ns));
            } else if bns != ns {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
        } else {
            meta_mut(&mut obj).remove("namespace");
        }
        let body_rv = meta_str(&obj, "resourceVersion").to_string();
        let old_rv = meta_str(&old.value, "resourceVersion").to_string();
        if !body_rv.is_empty() && body_rv != old_rv {
            return Err(ApiError::modified(&def.ctx(), name));
        }
        if body_rv.is_empty() && !def.builtin && !from_patch {
            return Err(ApiError::invalid(
                &def.ctx(),
                name,
                vec![Cause {
                    reason: "FieldValueInvalid",
                    field: "metadata.resourceVersion".into(),
                    message: "Invalid value: 0x0: must be specified for an update".into(),
                }],
            ));
        }
        let old_uid = meta_str(&old.value, "uid").to_string();
        let body_uid = meta_str(&obj, "uid").to_string();
        if !body_uid.is_empty() && body_uid != old_uid {
            return Err(ApiError::conflict(
                &def.ctx(),
                name,
                &format!(
                    "Precondition failed: UID in precondition: {body_uid}, UID in object meta: {old_uid}"
                ),
            ));
        }
        // What the write may change.
        let mut new = match sub {
            Sub::Main => {
                let mut n = obj;
                if def.status {
                    match old.value.get("status") {
                        Some(s) if n.get("status") == Some(s) => {}
                        Some(s) => n["status"] = s.clone(),
                        None => {
                            if let Some(m) = n.as_object_mut() {
                                m.remove("status");
                            }
                        }
                    }
                }
                n
            }
            Sub::Status if def.builtin => {
                // Built-in status strategies keep the new metadata (Calico writes Node and Pod
                // annotations through status) but never the spec.
                let mut n = old.value.clone();
                if let (Some(nm), Some(src)) = (n.as_object_mut(), obj.as_object()) {
                    for (k, v) in src {
                        if k == "metadata" || k == "status" {
                            nm.insert(k.clone(), v.clone());
                        }
                    }
                    if !src.contains_key("status") {
                        nm.remove("status");
                    }
                }
                n
            }
            Sub::Status => {
                let mut n = old.value.clone();
                match obj.get("status") {
                    Some(s) => n["status"] = s.clone(),
                    None => {
                        if let Some(m) = n.as_object_mut() {
                            m.remove("status");
                        }
                    }
                }
                n
            }
        };
        {
            let empty = Map::new();
            let om = meta(&old.value).unwrap_or(&empty);
            let m = meta_mut(&mut new);
            for f in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
                "namespace",
                "name",
            ] {
                match om.get(f) {
                    Some(v) if m.get(f) == Some(v) => {}
                    Some(v) => {
                        m.insert(f.into(), v.clone());
                    }
                    None => {
                        m.remove(f);
                    }
                }
            }
            m.remove("managedFields");
            m.remove("selfLink");
            m.insert("resourceVersion".into(), json!(old_rv));
        }
        if meta(&old.value).is_some_and(|m| m.contains_key("deletionTimestamp")) {
            let old_f: Vec<Value> = meta(&old.value)
                .and_then(|m| m.get("finalizers"))
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let new_f: Vec<Value> = meta(&new)
                .and_then(|m| m.get("finalizers"))
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            if new_f.iter().any(|f| !old_f.contains(f)) {
                return Err(ApiError::invalid(
                    &def.ctx(),
                    name,
                    vec![Cause {
                        reason: "FieldValueForbidden",
                        field: "metadata.finalizers".into(),
                        message: "Forbidden: no new finalizers can be added if the object is being deleted".into(),
                    }],
                ));
            }
        }
        self.validate(&def, &new, name)?;
        if def.has_generation() && spec_part(&new) != spec_part(&old.value) {
            let g = meta(&old.value)
                .and_then(|m| m.get("generation"))
                .and_then(Value::as_i64)
                .unwrap_or(0);
            meta_mut(&mut new).insert("generation".into(), json!(g + 1));
        }
        let new_def = if def.kind == "CustomResourceDefinition" && def.builtin {
            let nd = crd_to_def(&new).map_err(|c| ApiError::invalid(&def.ctx(), name, c))?;
            if nd.key() != crd_to_def(&old.value).map(|d| d.key()).unwrap_or_default() {
                return Err(ApiError::invalid(
                    &def.ctx(),
                    name,
                    vec![Cause::invalid(
                        "spec.group",
                        &nd.group,
                        "field is immutable",
                    )],
                ));
            }
            Some(nd)
        } else {
            None
        };
        // An update that changes nothing writes nothing (etcd's GuaranteedUpdate).
        if new == old.value {
            return Ok(old);
        }
        if opts.dry_run {
            return Ok(Stored::new(new, old.rv));
        }
        let k = (
            if def.namespaced {
                ns.to_string()
            } else {
                String::new()
            },
            name.to_string(),
        );
        if meta(&new).is_some_and(|m| m.contains_key("deletionTimestamp")) && finalizers(&new) == 0
        {
            return Ok(self.remove(key, &k, new, Some(old)));
        }
        let out = self.commit(key, &k.0, &k.1, EventType::Modified, new, Some(old));
        if let Some(nd) = new_def
            && self.resources.get(&nd.key()).is_some_and(|c| *c.def != nd)
        {
            self.register(nd);
        }
        Ok(out)
    }

    /// PATCH. Returns the object and whether it was created (server-side apply).
    #[allow(clippy::too_many_arguments)]
    pub fn patch(
        &mut self,
        key: &str,
        ns: &str,
        name: &str,
        ptype: PatchType,
        patch: &Value,
        sub: Sub,
        opts: &WriteOpts,
    ) -> Result<(Obj, bool), ApiError> {
        let def = self.def(key)?;
        if ptype == PatchType::Strategic && !def.builtin {
            return Err(ApiError::unsupported_media_type(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
            ));
        }
        let old = match self.get(key, ns, name) {
            Ok(o) => o,
            Err(e) if e.code == 404 && ptype == PatchType::Apply && sub == Sub::Main => {
                let mut obj = patch.clone();
                if !obj.is_object() {
                    return Err(ApiError::bad_request(
                        "the body of the request must be a JSON object",
                    ));
                }
                let bn = meta_str(&obj, "name").to_string();
                if !bn.is_empty() && bn != name {
                    return Err(ApiError::bad_request(format!(
                        "the name of the object ({bn}) does not match the name on the URL ({name})"
                    )));
                }
                meta_mut(&mut obj).insert("name".into(), json!(name));
                return self.create(key, ns, obj, opts).map(|o| (o, true));
            }
            Err(e) => return Err(e),
        };
        let mut cur = old.value.clone();
        let res = match ptype {
            PatchType::Merge => {
                if !patch.is_object() {
                    return Err(ApiError::bad_request(
                        "json: cannot unmarshal into a merge patch: the patch must be a JSON object",
                    ));
                }
                patch::merge_patch(&mut cur, patch);
                Ok(())
            }
            PatchType::Json => patch::json_patch(&mut cur, patch),
            PatchType::Strategic => patch::strategic_merge(&mut cur, patch, &def.kind),
            PatchType::Apply => {
                let av = patch
                    .get("apiVersion")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                let kd = patch.get("kind").and_then(Value::as_str).unwrap_or("");
                if av.is_empty() || kd.is_empty() {
                    return Err(ApiError::bad_request(
                        "apiVersion and kind must be set in an apply patch",
                    ));
                }
                patch::apply_merge(&mut cur, patch, def.builtin, &def.kind)
            }
        };
        match res {
            Ok(()) => {}
            Err(PatchError::Bad(m)) => return Err(ApiError::bad_request(m)),
            Err(PatchError::Unapplicable(m)) => return Err(ApiError::new(422, "Invalid", m)),
        }
        if !cur.is_object() {
            return Err(ApiError::bad_request(
                "the patched object is not a JSON object",
            ));
        }
        let prv = meta_str(&cur, "resourceVersion").to_string();
        if !prv.is_empty() && prv != meta_str(&old.value, "resourceVersion") {
            return Err(ApiError::modified(&def.ctx(), name));
        }
        let bn = meta_str(&cur, "name").to_string();
        if bn != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({bn}) does not match the name on the URL ({name})"
            )));
        }
        self.update(key, ns, name, cur, sub, opts, true)
            .map(|o| (o, false))
    }

    /// Removes an object for good (the DELETED event carries its last state).
    pub(super) fn remove(&mut self, key: &str, k: &Key, last: Value, prev: Option<Obj>) -> Obj {
        let def = self.resources.get(key).map(|c| c.def.clone());
        // Deleting a namespace deletes its objects; deleting a CRD, its custom resources.
        if let Some(def) = &def {
            if def.builtin && def.kind == "Namespace" {
                let keys: Vec<String> = self.order.clone();
                for rk in keys {
                    let victims: Vec<Key> = match self.resources.get(&rk) {
                        Some(c) if c.def.namespaced => c
                            .objects
                            .range((k.1.clone(), String::new())..)
                            .take_while(|(kk, _)| kk.0 == k.1)
                            .map(|(kk, _)| kk.clone())
                            .collect(),
                        _ => vec![],
                    };
                    for v in victims {
                        if let Some(o) = self
                            .resources
                            .get(&rk)
                            .and_then(|c| c.objects.get(&v))
                            .cloned()
                        {
                            self.commit(
                                &rk,
                                &v.0,
                                &v.1,
                                EventType::Deleted,
                                o.value.clone(),
                                Some(o),
                            );
                        }
                    }
                }
            }
            if def.builtin
                && def.kind == "CustomResourceDefinition"
                && let Ok(nd) = crd_to_def(&last)
            {
                let rk = nd.key();
                let victims: Vec<Obj> = self
                    .resources
                    .get(&rk)
                    .map(|c| c.objects.values().cloned().collect())
                    .unwrap_or_default();
                for o in victims {
                    let (ns, n) = (
                        meta_str(&o.value, "namespace").to_string(),
                        name_of(&o.value).to_string(),
                    );
                    self.commit(
                        &rk,
                        &ns,
                        &n,
                        EventType::Deleted,
                        o.value.clone(),
                        Some(o.clone()),
                    );
                }
                if self.resources.get(&rk).is_some_and(|c| !c.def.builtin) {
                    self.resources.remove(&rk);
                    self.order.retain(|x| *x != rk);
                    self.registry_gen += 1;
                }
            }
        }
        self.commit(key, &k.0, &k.1, EventType::Deleted, last, prev)
    }

    /// DELETE. Objects with finalizers (and, with the graceful option, pods) are only marked.
    pub fn delete(
        &mut self,
        key: &str,
        ns: &str,
        name: &str,
        opts: &DeleteOpts,
    ) -> Result<Obj, ApiError> {
        let def = self.def(key)?;
        let old = self.get(key, ns, name)?;
        let uid = meta_str(&old.value, "uid");
        if let Some(want) = opts.uid.as_deref().filter(|u| !u.is_empty())
            && want != uid
        {
            return Err(ApiError::conflict(
                &def.ctx(),
                name,
                &format!(
                    "Precondition failed: UID in precondition: {want}, UID in object meta: {uid}"
                ),
            ));
        }
        let rv = meta_str(&old.value, "resourceVersion");
        if let Some(want) = opts.rv.as_deref().filter(|r| !r.is_empty())
            && want != rv
        {
            return Err(ApiError::conflict(
                &def.ctx(),
                name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {want}, ResourceVersion in object meta: {rv}"
                ),
            ));
        }
        let k = (
            if def.namespaced {
                ns.to_string()
            } else {
                String::new()
            },
            name.to_string(),
        );
        let graceful_pod =
            def.builtin && def.kind == "Pod" && self.pods_graceful && opts.grace_seconds != Some(0);
        if finalizers(&old.value) > 0 || graceful_pod {
            if meta(&old.value).is_some_and(|m| m.contains_key("deletionTimestamp")) {
                return Ok(old);
            }
            let mut new = old.value.clone();
            let grace = if graceful_pod {
                opts.grace_seconds
                    .or_else(|| {
                        old.value
                            .pointer("/spec/terminationGracePeriodSeconds")
                            .and_then(Value::as_i64)
                    })
                    .unwrap_or(30)
                    // A request may ask for any number; keep the timestamp representable.
                    .clamp(0, 365 * 86_400)
            } else {
                0
            };
            let m = meta_mut(&mut new);
            m.insert(
                "deletionTimestamp".into(),
                json!(util::rfc3339(util::now_secs() + grace)),
            );
            m.insert("deletionGracePeriodSeconds".into(), json!(grace));
            if opts.dry_run {
                return Ok(Stored::new(new, old.rv));
            }
            return Ok(self.commit(key, &k.0, &k.1, EventType::Modified, new, Some(old)));
        }
        if opts.dry_run {
            return Ok(old);
        }
        Ok(self.remove(key, &k, old.value.clone(), Some(old)))
    }
}
