// SPDX-License-Identifier: Apache-2.0
// margay's Services in BPF (kube-proxy replacement, IPv4): included by policy.c, whose entry
// points call svc_from_wl before the workload's egress policy (DNAT: the policy sees the
// backend) and svc_to_wl after its ingress policy allowed a packet (reverse NAT of a
// backend's reply). Layouts are mirrored byte for byte by crates/bpf/src/services.rs.
//
// Maps: a frontend (address, port, protocol) names a backend group (id) and its size; the
// backends are {id, slot}; a NAT conntrack entry per direction keeps a flow on its backend
// and turns the reply's source back into the frontend; ClientIP affinity remembers the
// backend per (client, group).

#define SVC_CONTINUE (-100) // not a verdict: go on with policy

#define SVC_F_AFFINITY 0x1 // sessionAffinity ClientIP (timeout in affinity_s)
#define SVC_F_SNAT 0x2     // external traffic, externalTrafficPolicy Cluster: the source becomes
			   // the node's address (the frontend's), so replies come back here

#define SVC_DIR_FWD 0
#define SVC_DIR_REV 1

// A packet bounced back to its sender as ICMP port unreachable carries this mark: the
// workload's to_wl hook lets it through without policy. A pod cannot forge it (the mark is
// cleared when a packet leaves the pod's network namespace).
#define SVC_REJECT_MARK 0x4d470001

#define SVC_NAT_TCP_TIMEOUT (3600 * SEC_NS)
#define SVC_NAT_OTHER_TIMEOUT (60 * SEC_NS)

struct svc_fe_key {
	__u32 addr; // network order
	__u16 port; // network order
	__u8 proto;
	__u8 pad;
};

struct svc_fe_val {
	__u32 id;         // the backend group
	__u32 count;      // backends at slots 0..count-1; 0: reject
	__u32 flags;      // SVC_F_*
	__u32 affinity_s; // ClientIP affinity timeout (seconds)
};

struct svc_be_key {
	__u32 id;
	__u32 slot;
};

struct svc_be_val {
	__u32 addr; // network order
	__u16 port; // network order
	__u16 pad;
};

struct svc_ct_key {
	__u32 saddr, daddr;
	__u16 sport, dport;
	__u8 proto;
	__u8 dir; // SVC_DIR_*
	__u8 pad[2];
};

// FWD: the backend to send the flow to; REV: the frontend the reply comes from.
struct svc_ct_val {
	__u64 last_seen_ns;
	__u32 addr;
	__u16 port;
	__u16 pad;
};

struct svc_aff_key {
	__u32 client;
	__u32 id;
};

struct svc_aff_val {
	__u64 ts_ns; // when the affinity was made (kube-proxy: it lasts the timeout from then)
	__u32 addr;
	__u16 port;
	__u16 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct svc_fe_key);
	__type(value, struct svc_fe_val);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} mgy_svc_fe SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct svc_be_key);
	__type(value, struct svc_be_val);
	__uint(max_entries, 262144);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} mgy_svc_be SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct svc_ct_key);
	__type(value, struct svc_ct_val);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} mgy_svc_ct SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct svc_aff_key);
	__type(value, struct svc_aff_val);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} mgy_svc_aff SEC(".maps");

// Frontends as traffic from outside the node meets them on the node's data interfaces
// (mgy_host_in): NodePorts on each node address, ExternalIPs, LoadBalancer addresses; their
// groups hold the external backends (this node's under externalTrafficPolicy Local).
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct svc_fe_key);
	__type(value, struct svc_fe_val);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} mgy_svc_ext SEC(".maps");

// NAT state of external flows, keyed by the packet it applies to:
// - FWD (client → frontend, on the data interface's ingress): the new destination (the
//   backend); the kernel routes the packet, whose source is still the client's;
// - SNAT (client → backend, where it leaves: the local backend's to_wl hook after its
//   policy, or a data interface's egress): the new source (the node's address), under
//   externalTrafficPolicy Cluster — after routing, so the node's own address never meets
//   the kernel's input path (it would drop it as a martian);
// - REV (the backend's reply): the new destination (the client) and source (the frontend),
//   then sent straight out of the interface the client's packet came in on (ifindex).
#define SVC_DIR_SNAT 2

struct svc_np_val {
	__u64 last_seen_ns;
	__u32 daddr, saddr;
	__u16 dport, sport;
	__u32 ifindex;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct svc_ct_key);
	__type(value, struct svc_np_val);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} mgy_svc_np SEC(".maps");

// The fields NAT needs; only unfragmented IPv4 TCP/UDP with a 20-byte header is translated.
struct svc_pkt {
	__u32 saddr, daddr;
	__u16 sport, dport;
	__u8 proto;
	__u8 syn; // TCP SYN without ACK: a new connection
};

static __always_inline int svc_parse(struct __sk_buff *skb, struct svc_pkt *p)
{
	if (skb->protocol != bpf_htons(ETH_P_IP))
		return -1;
	struct iphdr ip;
	if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)) < 0)
		return -1;
	if (ip.version != 4 || ip.ihl != 5)
		return -1;
	if (bpf_ntohs(ip.frag_off) & 0x3fff) // MF or an offset: fragments are not translated
		return -1;
	if (ip.protocol != IPPROTO_TCP && ip.protocol != IPPROTO_UDP)
		return -1;
	__u8 h[14];
	__u32 want = ip.protocol == IPPROTO_TCP ? 14 : 4;
	if (want == 14) {
		if (bpf_skb_load_bytes(skb, ETH_HLEN + 20, h, 14) < 0)
			return -1;
		p->syn = (h[13] & (TCP_SYN | TCP_ACK)) == TCP_SYN;
	} else {
		if (bpf_skb_load_bytes(skb, ETH_HLEN + 20, h, 4) < 0)
			return -1;
		p->syn = 0;
	}
	p->saddr = ip.saddr;
	p->daddr = ip.daddr;
	__builtin_memcpy(&p->sport, &h[0], 2);
	__builtin_memcpy(&p->dport, &h[2], 2);
	p->proto = ip.protocol;
	return 0;
}

// Rewrites the destination (dst=1) or source address and port, fixing the IP and L4
// checksums (the L4 one covers the address through the pseudo-header).
static __always_inline int svc_rewrite(struct __sk_buff *skb, const struct svc_pkt *p, int dst,
				       __u32 addr, __u16 port)
{
	__u32 addr_off = ETH_HLEN + (dst ? __builtin_offsetof(struct iphdr, daddr) : __builtin_offsetof(struct iphdr, saddr));
	__u32 port_off = ETH_HLEN + 20 + (dst ? 2 : 0);
	__u32 csum_off = ETH_HLEN + 20 + (p->proto == IPPROTO_TCP ? 16 : 6);
	__u32 old_addr = dst ? p->daddr : p->saddr;
	__u16 old_port = dst ? p->dport : p->sport;
	__u64 mangled = p->proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;
	if (old_addr != addr) {
		if (bpf_l4_csum_replace(skb, csum_off, old_addr, addr,
					BPF_F_PSEUDO_HDR | mangled | sizeof(addr)) < 0)
			return -1;
		if (bpf_l3_csum_replace(skb, ETH_HLEN + __builtin_offsetof(struct iphdr, check), old_addr,
					addr, sizeof(addr)) < 0)
			return -1;
		if (bpf_skb_store_bytes(skb, addr_off, &addr, sizeof(addr), 0) < 0)
			return -1;
	}
	if (old_port != port) {
		if (bpf_l4_csum_replace(skb, csum_off, old_port, port, mangled | sizeof(port)) < 0)
			return -1;
		if (bpf_skb_store_bytes(skb, port_off, &port, sizeof(port), 0) < 0)
			return -1;
	}
	return 0;
}

static __always_inline __u16 svc_fold(__s64 sum)
{
	__u32 s = (__u32)sum;
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return (__u16)~s;
}

// Turns the packet into an ICMP port unreachable from the frontend to the client (the
// original IP header and 8 bytes quoted, as RFC 792 asks) and sends it back out of the
// interface it came in on: the client's connect() fails at once (TCP: ECONNREFUSED), as
// with Calico's BPF mode for a service without backends.
static __always_inline int svc_reject(struct __sk_buff *skb)
{
	struct {
		__u8 eth[14];
		__u8 pad[2]; // keeps the IP header 4-byte aligned for bpf_csum_diff
		struct iphdr ip;
		__u8 icmp[8];
		struct iphdr orig;
		__u8 l4[8];
	} b = {};
	if (bpf_skb_load_bytes(skb, 0, b.eth, 14) < 0 ||
	    bpf_skb_load_bytes(skb, ETH_HLEN, &b.orig, 20) < 0 ||
	    bpf_skb_load_bytes(skb, ETH_HLEN + 20, b.l4, 8) < 0)
		return TC_ACT_SHOT;
	__u8 mac[6];
	__builtin_memcpy(mac, b.eth, 6);
	__builtin_memcpy(b.eth, b.eth + 6, 6);
	__builtin_memcpy(b.eth + 6, mac, 6);
	b.ip.version = 4;
	b.ip.ihl = 5;
	b.ip.tot_len = bpf_htons(20 + 8 + 28);
	b.ip.ttl = 64;
	b.ip.protocol = IPPROTO_ICMP;
	b.ip.saddr = b.orig.daddr;
	b.ip.daddr = b.orig.saddr;
	b.ip.check = svc_fold(bpf_csum_diff(0, 0, (__be32 *)&b.ip, 20, 0));
	b.icmp[0] = 3; // destination unreachable
	b.icmp[1] = 3; // port unreachable
	__u16 ic = svc_fold(bpf_csum_diff(0, 0, (__be32 *)b.icmp, 36, 0));
	__builtin_memcpy(&b.icmp[2], &ic, 2);
	if (bpf_skb_change_tail(skb, 14 + 20 + 8 + 28, 0) < 0)
		return TC_ACT_SHOT;
	if (bpf_skb_store_bytes(skb, 0, b.eth, 14, 0) < 0 ||
	    bpf_skb_store_bytes(skb, 14, &b.ip, 56, BPF_F_INVALIDATE_HASH) < 0)
		return TC_ACT_SHOT;
	skb->mark = SVC_REJECT_MARK;
	return bpf_redirect(skb->ifindex, 0);
}

// The backend for a new flow: the client's affinity entry while it lasts, else a random
// slot (and, with affinity, a new entry).
static __always_inline int svc_pick(__u32 id, __u32 count, __u32 flags, __u32 affinity_s,
				    __u32 client, __u64 now, struct svc_be_val *be)
{
	struct svc_aff_key ak = {.client = client, .id = id};
	if (flags & SVC_F_AFFINITY) {
		struct svc_aff_val *av = bpf_map_lookup_elem(&mgy_svc_aff, &ak);
		if (av && now - av->ts_ns <= (__u64)affinity_s * SEC_NS) {
			be->addr = av->addr;
			be->port = av->port;
			return 0;
		}
	}
	if (count == 0)
		return -1;
	struct svc_be_key bk = {.id = id, .slot = bpf_get_prandom_u32() % count};
	struct svc_be_val *b = bpf_map_lookup_elem(&mgy_svc_be, &bk);
	if (!b)
		return -1;
	*be = *b;
	if (flags & SVC_F_AFFINITY) {
		struct svc_aff_val av = {.ts_ns = now, .addr = be->addr, .port = be->port};
		bpf_map_update_elem(&mgy_svc_aff, &ak, &av, BPF_ANY);
	}
	return 0;
}

static __always_inline int svc_ct_put(const struct svc_pkt *p, __u32 be_addr, __u16 be_port,
					__u64 now)
{
	struct svc_ct_key fk = {.saddr = p->saddr, .daddr = p->daddr, .sport = p->sport,
				.dport = p->dport, .proto = p->proto, .dir = SVC_DIR_FWD};
	struct svc_ct_val fv = {.last_seen_ns = now, .addr = be_addr, .port = be_port};
	struct svc_ct_key rk = {.saddr = be_addr, .daddr = p->saddr, .sport = be_port,
				.dport = p->sport, .proto = p->proto, .dir = SVC_DIR_REV};
	struct svc_ct_val rv = {.last_seen_ns = now, .addr = p->daddr, .port = p->dport};
	// The reverse entry first: the reply must never arrive before it.
	if (bpf_map_update_elem(&mgy_svc_ct, &rk, &rv, BPF_ANY) < 0)
		return -1;
	return bpf_map_update_elem(&mgy_svc_ct, &fk, &fv, BPF_ANY);
}

// From a workload, before its egress policy: a packet of a translated flow, or to a
// frontend, is sent to its backend; to a frontend without backends it is rejected.
// A global function: the verifier checks it once, on its own, so its many paths do not
// multiply the states in which the policy loop after it is verified.
__attribute__((noinline)) int svc_from_wl(struct __sk_buff *skb)
{
	if (!skb)
		return SVC_CONTINUE;
	__u32 ifindex = skb->ifindex;
	if (!bpf_map_lookup_elem(&mgy_eps, &ifindex))
		return SVC_CONTINUE; // no endpoint: the policy drops it
	struct svc_pkt p = {};
	if (svc_parse(skb, &p) < 0)
		return SVC_CONTINUE;
	__u64 now = bpf_ktime_get_ns();
	// A local backend's reply to a SNATed external flow: back to the client's address
	// before the egress policy; svc_from_wl_after does the rest.
	struct svc_ct_key nk = {.saddr = p.saddr, .daddr = p.daddr, .sport = p.sport,
				.dport = p.dport, .proto = p.proto, .dir = SVC_DIR_REV};
	struct svc_np_val *ne = bpf_map_lookup_elem(&mgy_svc_np, &nk);
	if (ne && ne->daddr != p.daddr) {
		if (svc_rewrite(skb, &p, 1, ne->daddr, p.dport) < 0)
			return TC_ACT_SHOT;
		return SVC_CONTINUE;
	}
	struct svc_ct_key fk = {.saddr = p.saddr, .daddr = p.daddr, .sport = p.sport,
				.dport = p.dport, .proto = p.proto, .dir = SVC_DIR_FWD};
	struct svc_ct_val *cv = bpf_map_lookup_elem(&mgy_svc_ct, &fk);
	if (cv) {
		__u64 t = p.proto == IPPROTO_TCP ? SVC_NAT_TCP_TIMEOUT : SVC_NAT_OTHER_TIMEOUT;
		if (now - cv->last_seen_ns <= t) {
			cv->last_seen_ns = now;
			__u32 addr = cv->addr;
			__u16 port = cv->port;
			// A new connection on a reused client port: its reverse entry may have been
			// taken by a direct flow meanwhile; write both again (same backend).
			if (p.syn && svc_ct_put(&p, addr, port, now) < 0)
				return TC_ACT_SHOT;
			if (svc_rewrite(skb, &p, 1, addr, port) < 0)
				return TC_ACT_SHOT;
			return SVC_CONTINUE;
		}
	}
	struct svc_fe_key k = {.addr = p.daddr, .port = p.dport, .proto = p.proto};
	struct svc_fe_val *fe = bpf_map_lookup_elem(&mgy_svc_fe, &k);
	if (!fe) {
		// A new flow straight to a pod on a tuple an earlier service flow used (a reused
		// client port): its replies must not be translated back to that frontend.
		if (p.syn || p.proto == IPPROTO_UDP) {
			struct svc_ct_key rk = {.saddr = p.daddr, .daddr = p.saddr, .sport = p.dport,
						.dport = p.sport, .proto = p.proto,
						.dir = SVC_DIR_REV};
			bpf_map_delete_elem(&mgy_svc_ct, &rk);
		}
		return SVC_CONTINUE;
	}
	__u32 id = fe->id, count = fe->count;
	if (count == 0)
		return svc_reject(skb);
	struct svc_be_val be = {};
	if (svc_pick(id, count, fe->flags, fe->affinity_s, p.saddr, now, &be) < 0)
		return TC_ACT_SHOT; // a hole (a torn write or a bug): fail closed
	if (svc_ct_put(&p, be.addr, be.port, now) < 0)
		return TC_ACT_SHOT;
	if (svc_rewrite(skb, &p, 1, be.addr, be.port) < 0)
		return TC_ACT_SHOT;
	return SVC_CONTINUE;
}

// To a workload, after its ingress policy allowed the packet: a backend's reply gets the
// frontend back as its source.
__attribute__((noinline)) int svc_to_wl(struct __sk_buff *skb)
{
	struct svc_pkt p = {};
	if (!skb || svc_parse(skb, &p) < 0)
		return TC_ACT_OK;
	struct svc_ct_key rk = {.saddr = p.saddr, .daddr = p.daddr, .sport = p.sport,
				.dport = p.dport, .proto = p.proto, .dir = SVC_DIR_REV};
	struct svc_ct_val *cv = bpf_map_lookup_elem(&mgy_svc_ct, &rk);
	if (!cv)
		return TC_ACT_OK;
	cv->last_seen_ns = bpf_ktime_get_ns();
	if (svc_rewrite(skb, &p, 0, cv->addr, cv->port) < 0)
		return TC_ACT_SHOT;
	return TC_ACT_OK;
}

// An external flow's reply: both addresses back, then out of the interface the client's
// packet came in on (the kernel resolves the next hop).
static __always_inline int svc_np_reply(struct __sk_buff *skb, const struct svc_pkt *p,
					const struct svc_np_val *v)
{
	if (svc_rewrite(skb, p, 1, v->daddr, v->dport) < 0)
		return TC_ACT_SHOT;
	if (svc_rewrite(skb, p, 0, v->saddr, v->sport) < 0)
		return TC_ACT_SHOT;
	return bpf_redirect_neigh(v->ifindex, 0, 0, 0);
}

// Traffic arriving on a data interface (the uplink, the VXLAN device): a reply of an external
// flow (from a backend on another node), a packet of one, or a new one to an external
// frontend (NodePort, ExternalIP, LoadBalancer address). Everything else passes untouched.
__attribute__((noinline)) int svc_host_in(struct __sk_buff *skb)
{
	struct svc_pkt p = {};
	if (!skb || svc_parse(skb, &p) < 0)
		return TC_ACT_OK;
	__u64 now = bpf_ktime_get_ns();
	struct svc_ct_key k = {.saddr = p.saddr, .daddr = p.daddr, .sport = p.sport,
			       .dport = p.dport, .proto = p.proto, .dir = SVC_DIR_REV};
	struct svc_np_val *e = bpf_map_lookup_elem(&mgy_svc_np, &k);
	if (e) {
		e->last_seen_ns = now;
		struct svc_np_val c = *e;
		return svc_np_reply(skb, &p, &c);
	}
	k.dir = SVC_DIR_FWD;
	e = bpf_map_lookup_elem(&mgy_svc_np, &k);
	if (e) {
		__u64 t = p.proto == IPPROTO_TCP ? SVC_NAT_TCP_TIMEOUT : SVC_NAT_OTHER_TIMEOUT;
		if (now - e->last_seen_ns <= t) {
			e->last_seen_ns = now;
			if (svc_rewrite(skb, &p, 1, e->daddr, e->dport) < 0)
				return TC_ACT_SHOT;
			return TC_ACT_OK;
		}
	}
	struct svc_fe_key fk = {.addr = p.daddr, .port = p.dport, .proto = p.proto};
	struct svc_fe_val *fe = bpf_map_lookup_elem(&mgy_svc_ext, &fk);
	if (!fe)
		return TC_ACT_OK;
	__u32 id = fe->id, count = fe->count, flags = fe->flags, aff = fe->affinity_s;
	if (count == 0)
		return svc_reject(skb);
	struct svc_be_val be = {};
	if (svc_pick(id, count, flags, aff, p.saddr, now, &be) < 0)
		return TC_ACT_SHOT;
	__u32 nsrc = (flags & SVC_F_SNAT) ? p.daddr : p.saddr;
	struct svc_ct_key rk = {.saddr = be.addr, .daddr = nsrc, .sport = be.port,
				.dport = p.sport, .proto = p.proto, .dir = SVC_DIR_REV};
	struct svc_np_val rv = {.last_seen_ns = now, .daddr = p.saddr, .dport = p.sport,
				.saddr = p.daddr, .sport = p.dport, .ifindex = skb->ifindex};
	struct svc_np_val fv = {.last_seen_ns = now, .daddr = be.addr, .dport = be.port};
	if (bpf_map_update_elem(&mgy_svc_np, &rk, &rv, BPF_ANY) < 0)
		return TC_ACT_SHOT;
	if (flags & SVC_F_SNAT) {
		struct svc_ct_key sk = {.saddr = p.saddr, .daddr = be.addr, .sport = p.sport,
					.dport = be.port, .proto = p.proto, .dir = SVC_DIR_SNAT};
		struct svc_np_val sv = {.last_seen_ns = now, .saddr = nsrc, .sport = p.sport};
		// A local backend's reply is un-SNATed before its egress policy (which then sees
		// the reply of the flow its ingress policy judged, client → backend) and leaves
		// by this entry.
		rk.daddr = p.saddr;
		if (bpf_map_update_elem(&mgy_svc_np, &rk, &rv, BPF_ANY) < 0)
			return TC_ACT_SHOT;
		rk.daddr = nsrc;
		if (bpf_map_update_elem(&mgy_svc_np, &sk, &sv, BPF_ANY) < 0)
			return TC_ACT_SHOT;
	}
	if (bpf_map_update_elem(&mgy_svc_np, &k, &fv, BPF_ANY) < 0)
		return TC_ACT_SHOT;
	if (svc_rewrite(skb, &p, 1, be.addr, be.port) < 0)
		return TC_ACT_SHOT;
	return TC_ACT_OK;
}

// Where an external flow leaves toward its backend (a data interface's egress, or a local
// backend's to_wl hook after its policy): the source becomes the node's address under
// externalTrafficPolicy Cluster.
__attribute__((noinline)) int svc_snat(struct __sk_buff *skb)
{
	struct svc_pkt p = {};
	if (!skb || svc_parse(skb, &p) < 0)
		return TC_ACT_OK;
	struct svc_ct_key k = {.saddr = p.saddr, .daddr = p.daddr, .sport = p.sport,
			       .dport = p.dport, .proto = p.proto, .dir = SVC_DIR_SNAT};
	struct svc_np_val *e = bpf_map_lookup_elem(&mgy_svc_np, &k);
	if (!e)
		return TC_ACT_OK;
	e->last_seen_ns = bpf_ktime_get_ns();
	if (svc_rewrite(skb, &p, 0, e->saddr, e->sport) < 0)
		return TC_ACT_SHOT;
	return TC_ACT_OK;
}

// From a workload, after its egress policy allowed the packet: a local backend's reply to an
// external flow goes back to the client from the frontend.
__attribute__((noinline)) int svc_from_wl_after(struct __sk_buff *skb)
{
	struct svc_pkt p = {};
	if (!skb || svc_parse(skb, &p) < 0)
		return TC_ACT_OK;
	struct svc_ct_key k = {.saddr = p.saddr, .daddr = p.daddr, .sport = p.sport,
			       .dport = p.dport, .proto = p.proto, .dir = SVC_DIR_REV};
	struct svc_np_val *e = bpf_map_lookup_elem(&mgy_svc_np, &k);
	if (!e)
		return TC_ACT_OK;
	e->last_seen_ns = bpf_ktime_get_ns();
	struct svc_np_val c = *e;
	return svc_np_reply(skb, &p, &c);
}

// On the node's data interfaces: external traffic to Services (ingress), and its source
// translation on the way to a backend on another node (egress).
SEC("classifier")
int mgy_host_in(struct __sk_buff *skb)
{
	return svc_host_in(skb);
}

SEC("classifier")
int mgy_host_out(struct __sk_buff *skb)
{
	return svc_snat(skb);
}
