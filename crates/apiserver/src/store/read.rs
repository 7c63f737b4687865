//! Reads: lists (with continue tokens and resourceVersion semantics) and watch start-up from
//! the history.

use super::*;

impl State {
    /// The state of one resource at revision `at` for keys after `start`: current objects,
    /// with everything written after `at` undone from the history.
    /// Calls `f` for each object in key order until it returns false.
    pub(super) fn snapshot_for_each(
        &self,
        c: &Collection,
        at: u64,
        start: Option<&Key>,
        ns: Option<&str>,
        f: &mut dyn FnMut(&Key, &Obj) -> bool,
    ) {
        let mut overrides: BTreeMap<Key, Option<Obj>> = BTreeMap::new();
        if at < self.rv {
            let first = self.history.front().map_or(self.rv + 1, |e| e.rv);
            let from = (at + 1).saturating_sub(first) as usize;
            for e in self.history.iter().skip(from) {
                if *e.gr != *c.gr {
                    continue;
                }
                let k = (e.ns.clone(), name_of(&e.obj.value).to_string());
                overrides.entry(k).or_insert_with(|| e.prev.clone());
            }
        }
        let lower = match (start, ns) {
            (Some(s), _) => std::ops::Bound::Excluded(s.clone()),
            (None, Some(n)) => std::ops::Bound::Included((n.to_string(), String::new())),
            (None, None) => std::ops::Bound::Unbounded,
        };
        let in_ns = |k: &Key| ns.is_none_or(|n| k.0 == n);
        let mut cur = c
            .objects
            .range((lower.clone(), std::ops::Bound::Unbounded))
            .peekable();
        let mut ovr = overrides
            .range((lower, std::ops::Bound::Unbounded))
            .peekable();
        loop {
            let pick_cur = match (cur.peek(), ovr.peek()) {
                (None, None) => break,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (Some((a, _)), Some((b, _))) => a < b,
            };
            if pick_cur {
                if let Some((k, o)) = cur.next() {
                    if let Some(n) = ns
                        && k.0.as_str() > n
                    {
                        break;
                    }
                    if in_ns(k) && !f(k, o) {
                        break;
                    }
                }
            } else if let Some((k, o)) = ovr.next() {
                if cur.peek().is_some_and(|(ck, _)| *ck == k) {
                    cur.next();
                }
                if let Some(n) = ns
                    && k.0.as_str() > n
                {
                    break;
                }
                if let (true, Some(o)) = (in_ns(k), o)
                    && !f(k, o)
                {
                    break;
                }
            }
        }
    }

    pub fn list(&self, key: &str, q: &ListQuery) -> Result<ListResult, ApiError> {
        let c = self.resources.get(key).ok_or_else(|| {
            ApiError::new(
                404,
                "NotFound",
                "the server could not find the requested resource",
            )
        })?;
        let (at, start) = match &q.cont {
            Some(tok) => {
                let (rv, k) = decode_continue(tok)?;
                if rv < self.floor || rv > self.rv {
                    return Err(ApiError::expired(CONTINUE_EXPIRED));
                }
                (rv, Some(k))
            }
            None => match q.rv {
                RvMatch::Exact(n) => {
                    if n < self.floor {
                        return Err(ApiError::too_old(n, self.floor));
                    }
                    (n.min(self.rv), None)
                }
                RvMatch::Latest => (self.rv, None),
            },
        };
        let ns =
            q.ns.as_deref()
                .filter(|n| !n.is_empty() && c.def.namespaced);
        let matches = |o: &Obj| q.label.matches(&o.value) && q.field.matches(&o.value);
        let limit = q.limit.filter(|l| *l > 0);
        let unfiltered = q.label.is_empty() && q.field.is_empty();
        let mut items: Vec<Obj> = Vec::new();
        let mut last: Option<Key> = None;
        let mut full = false;
        let mut more: u64 = 0;
        self.snapshot_for_each(c, at, start.as_ref(), ns, &mut |k, o| {
            if full {
                // Past a full page: count what is left (only reported without selectors).
                more += 1;
                return unfiltered;
            }
            if !matches(o) {
                return true;
            }
            if limit.is_some_and(|l| items.len() >= l) {
                full = true;
                more = 1;
                return unfiltered;
            }
            items.push(o.clone());
            last = Some(k.clone());
            true
        });
        let cont = if full {
            last.as_ref().map(|k| encode_continue(at, k))
        } else {
            None
        };
        let remaining = (full && unfiltered).then_some(more);
        Ok(ListResult {
            items,
            rv: at,
            cont,
            remaining,
        })
    }

    /// Where a watch starts: the synthetic ADDED objects (none when resuming from a revision)
    /// and the first revision to deliver.
    pub fn watch_start(
        &self,
        key: &str,
        from: Option<u64>,
        initial_events: bool,
        filter: &dyn Fn(&Key, &Obj) -> bool,
    ) -> Result<WatchStart, ApiError> {
        let c = self.resources.get(key).ok_or_else(|| {
            ApiError::new(
                404,
                "NotFound",
                "the server could not find the requested resource",
            )
        })?;
        match from {
            Some(n) if n > 0 && !initial_events => {
                if n < self.floor {
                    return Err(ApiError::too_old(n, self.floor));
                }
                Ok(WatchStart {
                    initial: vec![],
                    next_rv: n + 1,
                    def: c.def.clone(),
                })
            }
            _ => {
                if let Some(n) = from.filter(|n| *n > 0 && *n < self.floor) {
                    return Err(ApiError::too_old(n, self.floor));
                }
                let initial = c
                    .objects
                    .iter()
                    .filter(|(k, o)| filter(k, o))
                    .map(|(_, o)| o.clone())
                    .collect();
                Ok(WatchStart {
                    initial,
                    next_rv: self.rv + 1,
                    def: c.def.clone(),
                })
            }
        }
    }

    /// Events from `next_rv` on (at most `max_scan` looked at). `None` when the watcher fell
    /// behind the retained history or its resource is gone (the stream must end).
    pub fn events_since(
        &self,
        gr: &str,
        def: &Arc<ResourceDef>,
        next_rv: u64,
        max_scan: usize,
    ) -> Option<(Vec<Arc<Event>>, u64)> {
        // A resource that stopped being served (CRD deleted or changed) still delivers the
        // events written before that (its objects' deletions), then its watches end.
        let alive = matches!(self.resources.get(&gr_key(&def.group, &def.plural)), Some(c) if Arc::ptr_eq(&c.def, def));
        if next_rv <= self.floor {
            return None;
        }
        let Some(first) = self.history.front().map(|e| e.rv) else {
            return alive.then(|| (vec![], next_rv.max(self.rv + 1)));
        };
        let from = next_rv.saturating_sub(first) as usize;
        let mut out = Vec::new();
        let mut next = next_rv.max(first);
        for e in self.history.iter().skip(from).take(max_scan) {
            next = e.rv + 1;
            if *e.gr == *gr {
                out.push(e.clone());
            }
        }
        if !alive && out.is_empty() {
            return None;
        }
        Some((out, next))
    }
}
