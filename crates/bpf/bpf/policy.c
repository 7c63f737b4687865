// SPDX-License-Identifier: Apache-2.0
// margay's workload policy program (IPv4). Attached to a workload's host-side interface:
// the tc ingress hook sees traffic from the workload (its egress policy), the tc egress hook
// traffic to it (its ingress policy). Layouts here are mirrored byte for byte by
// crates/bpf/src/layout.rs; change both together (and the layout tests catch a mismatch).
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/in.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define MAX_SETS 4      // positive or negative IP-set references per rule side
#define MAX_NAMED 4     // named-port sets per rule side (each list)
#define MAX_PORTS 8     // port ranges per rule side (each list)
#define MAX_RULES 4096  // steps per endpoint and direction: rules evaluated + blocks entered
			// (the bpf_loop bound)

#define ACT_ALLOW 0
#define ACT_DENY 1
#define ACT_PASS 2 // continue at the step's pass_to (the next tier / profile)
#define ACT_LOG 3  // a flow event (with flow logs on), then evaluation continues

#define F_PROTO 0x01
#define F_NOT_PROTO 0x02
#define F_ICMP_TYPE 0x04
#define F_ICMP_CODE 0x08
#define F_NOT_ICMP_TYPE 0x10
#define F_NOT_ICMP_CODE 0x20

#define STEP_BLOCK 0 // evaluate a block of rules
#define STEP_DENY 1  // a tier's default deny
// The per-hook index (crates/bpf/src/index.rs), in the same slot after the main list:
#define STEP_REF 2        // names the main step `block`
#define STEP_INDEX 3      // refs block .. block + pass_to
#define INDEX_BASE 0x80000000u // idx of DEFAULT (protocol 0) and of {proto << 16 | port}
#define NO_STEP 0xffffffffu

#define HOOK_FROM_WL 0 // tc ingress: the workload's egress policy
#define HOOK_TO_WL 1   // tc egress: the workload's ingress policy

struct port_range {
	__u16 first;
	__u16 last;
};

struct side {
	__u32 sets[MAX_SETS];       // the address must be in every one
	__u32 not_sets[MAX_SETS];   // and in none of these
	__u32 named[MAX_NAMED];     // (addr, proto, port) in any one: an alternative to ports
	__u32 not_named[MAX_NAMED]; // in none of these
	struct port_range ports[MAX_PORTS];
	struct port_range not_ports[MAX_PORTS];
	__u8 n_sets, n_not_sets, n_named, n_not_named, n_ports, n_not_ports;
	__u8 pad[2];
};

struct rule {
	__u8 action;
	__u8 flags;
	__u8 proto;
	__u8 not_proto;
	__u8 icmp_type, icmp_code, not_icmp_type, not_icmp_code;
	__u32 rule_index; // the rule's index in its policy or profile (for flow events)
	__u32 pad;
	struct side src;
	struct side dst;
};

struct rule_key {
	__u32 slot;
	__u32 idx;
};

// One step of an endpoint hook's list.
struct step {
	__u32 kind;
	__u32 block;   // STEP_BLOCK: the block to evaluate
	__u32 pass_to; // a Pass rule in the block continues at this step
};

// Where a block's rules are: replaced by one map write when its policy changes (every
// endpoint using the policy sees the new rules at once).
struct block {
	__u32 slot;
	__u32 count;
};

// One endpoint: the step slot and step count per hook. Replaced by one map write (the flip).
struct endpoint {
	__u32 slot[2];
	__u32 count[2];
	__u32 flags;
	__u32 pad;
};

struct ipset_key {
	__u32 prefixlen; // 32 (set id) + CIDR bits, or 88 for an (addr, port, proto) member
	__u32 set_id;    // big-endian
	__u32 addr;      // network order
	__u16 port;      // network order
	__u8 proto;
	__u8 pad;
};

struct ct_key {
	__u32 ifindex;
	__u32 saddr;
	__u32 daddr;
	__u16 sport;
	__u16 dport;
	__u8 proto;
	__u8 hook; // the hook that judged the flow's first packet
	__u8 pad[2];
};

// Conntrack states (flags, only ever set) and their idle timeouts, as Calico's BPF
// defaults; mirrored by layout.rs, whose garbage collector applies the same table.
#define CT_REPLY_SEEN 0x01 // the other direction answered: TCP established
#define CT_FIN_FWD 0x02
#define CT_FIN_REV 0x04
#define CT_RST 0x08

#define SEC_NS 1000000000ULL
#define CT_TCP_SYN_SENT (20 * SEC_NS)
#define CT_TCP_ESTABLISHED (3600 * SEC_NS)
#define CT_TCP_FINS_SEEN (30 * SEC_NS)
#define CT_TCP_RESET_SEEN (40 * SEC_NS)
#define CT_UDP (60 * SEC_NS)
#define CT_ICMP (5 * SEC_NS)
#define CT_GENERIC (600 * SEC_NS)

#define TCP_FIN 0x01
#define TCP_SYN 0x02
#define TCP_RST 0x04
#define TCP_ACK 0x10

struct ct_val {
	__u64 last_seen_ns;
	__u32 flags;
	__u8 proto;
	__u8 pad[3];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct endpoint);
	__uint(max_entries, 4096);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} mgy_eps SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct rule_key);
	__type(value, struct rule);
	__uint(max_entries, 262144);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} mgy_rules SEC(".maps");

// Endpoint step lists, keyed like rules: {step slot, index}.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct rule_key);
	__type(value, struct step);
	__uint(max_entries, 262144);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} mgy_steps SEC(".maps");

// Blocks (one per policy or profile and hook, one per endpoint for its own guards).
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct block);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} mgy_blocks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct ipset_key);
	__type(value, __u32);
	__uint(max_entries, 1048576);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} mgy_ipsets SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct_key);
	__type(value, struct ct_val);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} mgy_ct SEC(".maps");

// Per-rule counters, keyed like the rules ({rule slot, index}): packets and bytes of the new
// flows the rule decided (Allow or Deny). Per CPU: no atomics on the packet path; userspace
// sums. An entry goes with its rule (a changed policy's rules are new ones, counted afresh).
struct counter {
	__u64 packets;
	__u64 bytes;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__type(key, struct rule_key);
	__type(value, struct counter);
	__uint(max_entries, 262144);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} mgy_counters SEC(".maps");

// Flow logs: one event per new flow judged by policy (never for packets conntrack passes),
// read by Felix (crates/bpf/src/flows.rs). Mirrored by layout.rs (FLOW_EVENT_SIZE).
#define EV_RULE 0     // a rule decided (slot, idx, rule_index, action)
#define EV_TIER_END 1 // a tier's default deny (step: its index in the endpoint's list)
#define EV_NO_MATCH 2 // the end of the list: no profile matched
#define EV_FAIL 3     // a missing step, block or rule (a torn write): fail closed

struct flow_event {
	__u64 ts_ns; // bpf_ktime_get_ns
	__u32 saddr, daddr;
	__u16 sport, dport; // network order (ICMP echo: the id)
	__u8 proto;
	__u8 hook;
	__u8 kind;
	__u8 action; // ACT_*: the verdict (or ACT_LOG for a Log rule, evaluation continued)
	__u32 ifindex;
	__u32 slot; // EV_RULE: the rule's {slot, idx} (as mgy_rules, mgy_counters)
	__u32 idx;
	__u32 rule_index; // EV_RULE: the rule's index in its policy or profile (rule.rule_index)
	__u32 step;       // EV_TIER_END: the deny step's index
	__u16 len;        // the packet's length (saturated)
	__u8 icmp_type, icmp_code;
};

// 256 KiB: ~4600 events; a full buffer drops the event (counted in mgy_flow_drops), never
// the packet.
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} mgy_flows SEC(".maps");

// [0]: 1 when Felix reads flow events (FlowLogsLocalReporter / FlowLogsFileEnabled); the
// loader clears it at start, the reader sets it.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} mgy_flow_cfg SEC(".maps");

// [0]: events dropped because the ring buffer was full (per CPU; userspace sums).
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} mgy_flow_drops SEC(".maps");

struct pkt {
	__u32 saddr, daddr;
	__u16 sport, dport; // network order; 0 without ports
	__u8 proto;
	__u8 icmp_type, icmp_code;
	__u8 has_ports;
	__u8 tcp_flags;
};

struct eval {
	struct pkt p;
	__u32 ep_slot;   // the endpoint hook's step list
	__u32 nsteps;
	__u32 step;      // the next step to enter (indexed: the lowest step still to enter)
	__u32 d_pos, d_end; // indexed: the default range's refs still to walk
	__u32 k_pos, k_end; // indexed: the packet's key range
	__u32 indexed;
	__u32 blk_slot;  // the block being evaluated
	__u32 blk_count;
	__u32 rule;      // the next rule of that block
	__u32 pass_to;
	int verdict;     // -1: none yet
	int decided;     // a rule decided: (blk_slot, rule) is it
	__u32 kind;      // EV_*: what decided
	__u32 rule_index; // EV_RULE: the deciding rule's index in its policy (rule.rule_index)
	__u32 at_step;   // EV_TIER_END: the deny step
	__u32 ifindex;
	__u32 len;
	__u8 hook;
	__u8 flow_logs;  // emit events
	__u8 pad[2];
};

// The rule loop's state, per CPU (a tc program runs to its end on one CPU, and never
// within itself). Kept in a map rather than on the stack: the verifier tracks stack
// values exactly and explores the bpf_loop callback once per distinct state it sees (a
// constant step count, an index or none...), while a map value's fields are unknown to it,
// so the callback is verified for one state. Not pinned: each loaded program has its own.
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct eval);
	__uint(max_entries, 1);
} mgy_eval SEC(".maps");

static __always_inline void emit(const struct pkt *p, __u32 ifindex, __u8 hook, __u8 kind,
				 __u8 action, __u32 slot, __u32 idx, __u32 rule_index,
				 __u32 step, __u32 len)
{
	struct flow_event *ev = bpf_ringbuf_reserve(&mgy_flows, sizeof(*ev), 0);
	if (!ev) {
		__u32 z = 0;
		__u64 *d = bpf_map_lookup_elem(&mgy_flow_drops, &z);
		if (d)
			*d += 1;
		return;
	}
	ev->ts_ns = bpf_ktime_get_ns();
	ev->saddr = p->saddr;
	ev->daddr = p->daddr;
	ev->sport = p->sport;
	ev->dport = p->dport;
	ev->proto = p->proto;
	ev->hook = hook;
	ev->kind = kind;
	ev->action = action;
	ev->ifindex = ifindex;
	ev->slot = slot;
	ev->idx = idx;
	ev->rule_index = rule_index;
	ev->step = step;
	ev->len = len > 0xffff ? 0xffff : len;
	ev->icmp_type = p->icmp_type;
	ev->icmp_code = p->icmp_code;
	bpf_ringbuf_submit(ev, 0);
}

static __always_inline int in_set(__u32 id, __u32 addr)
{
	struct ipset_key k = {.prefixlen = 64, .set_id = bpf_htonl(id), .addr = addr};
	return bpf_map_lookup_elem(&mgy_ipsets, &k) != 0;
}

static __always_inline int in_named(__u32 id, __u32 addr, __u16 port, __u8 proto)
{
	struct ipset_key k = {
		.prefixlen = 88, .set_id = bpf_htonl(id), .addr = addr, .port = port, .proto = proto};
	return bpf_map_lookup_elem(&mgy_ipsets, &k) != 0;
}

static __always_inline int side_matches(const struct side *s, __u32 addr, __u16 port_n,
					const struct pkt *p)
{
	__u16 port = bpf_ntohs(port_n);
	int i;
	for (i = 0; i < MAX_SETS; i++) {
		if (i >= s->n_sets)
			break;
		if (!in_set(s->sets[i], addr))
			return 0;
	}
	for (i = 0; i < MAX_SETS; i++) {
		if (i >= s->n_not_sets)
			break;
		if (in_set(s->not_sets[i], addr))
			return 0;
	}
	for (i = 0; i < MAX_PORTS; i++) {
		if (i >= s->n_not_ports)
			break;
		if (p->has_ports && port >= s->not_ports[i].first && port <= s->not_ports[i].last)
			return 0;
	}
	for (i = 0; i < MAX_NAMED; i++) {
		if (i >= s->n_not_named)
			break;
		if (p->has_ports && in_named(s->not_named[i], addr, port_n, p->proto))
			return 0;
	}
	if (s->n_ports == 0 && s->n_named == 0)
		return 1;
	if (!p->has_ports)
		return 0;
	for (i = 0; i < MAX_PORTS; i++) {
		if (i >= s->n_ports)
			break;
		if (port >= s->ports[i].first && port <= s->ports[i].last)
			return 1;
	}
	for (i = 0; i < MAX_NAMED; i++) {
		if (i >= s->n_named)
			break;
		if (in_named(s->named[i], addr, port_n, p->proto))
			return 1;
	}
	return 0;
}

static __always_inline int rule_matches(const struct rule *r, const struct pkt *p)
{
	if ((r->flags & F_PROTO) && p->proto != r->proto)
		return 0;
	if ((r->flags & F_NOT_PROTO) && p->proto == r->not_proto)
		return 0;
	if (r->flags & (F_ICMP_TYPE | F_NOT_ICMP_TYPE)) {
		if (p->proto != IPPROTO_ICMP)
			return 0;
		if ((r->flags & F_ICMP_TYPE) && p->icmp_type != r->icmp_type)
			return 0;
		if ((r->flags & F_ICMP_CODE) && p->icmp_code != r->icmp_code)
			return 0;
		if (r->flags & F_NOT_ICMP_TYPE) {
			if (r->flags & F_NOT_ICMP_CODE) {
				if (p->icmp_type == r->not_icmp_type && p->icmp_code == r->not_icmp_code)
					return 0;
			} else if (p->icmp_type == r->not_icmp_type) {
				return 0;
			}
		}
	}
	if (!side_matches(&r->src, p->saddr, p->sport, p))
		return 0;
	if (!side_matches(&r->dst, p->daddr, p->dport, p))
		return 0;
	return 1;
}

// One loop iteration: enter the next step (a block or a deny), or evaluate one rule of the
// current block. A block entry is read once per packet and step, so a packet evaluates a
// policy's old rules or its new ones, whole.
static long eval_step(__u32 i, void *data)
{
	__u32 z = 0;
	struct eval *e = bpf_map_lookup_elem(&mgy_eval, &z);
	(void)i;
	(void)data;
	if (!e)
		return 1; // (never: a one-entry array) no verdict: default deny
	if (e->rule >= e->blk_count) {
		__u32 at = e->step;
		if (e->indexed) {
			// Merge the default and key ranges by step index; entries below the
			// current step (passed over by a Pass) are skipped one per iteration.
			__u32 od = NO_STEP, ok = NO_STEP;
			if (e->d_pos < e->d_end) {
				struct rule_key rk = {.slot = e->ep_slot, .idx = e->d_pos};
				struct step *r = bpf_map_lookup_elem(&mgy_steps, &rk);
				if (!r || r->kind != STEP_REF)
					goto hole;
				od = r->block;
				if (od < e->step) {
					e->d_pos++;
					return 0;
				}
			}
			if (e->k_pos < e->k_end) {
				struct rule_key rk = {.slot = e->ep_slot, .idx = e->k_pos};
				struct step *r = bpf_map_lookup_elem(&mgy_steps, &rk);
				if (!r || r->kind != STEP_REF)
					goto hole;
				ok = r->block;
				if (ok < e->step) {
					e->k_pos++;
					return 0;
				}
			}
			if (od == NO_STEP && ok == NO_STEP)
				return 1; // the end of the list: no verdict, default deny
			if (od <= ok) {
				at = od;
				e->d_pos++;
			} else {
				at = ok;
				e->k_pos++;
			}
		}
		if (at >= e->nsteps || at >= MAX_RULES)
			return 1; // the end of the list: no verdict, default deny
		struct rule_key sk = {.slot = e->ep_slot, .idx = at};
		struct step *s = bpf_map_lookup_elem(&mgy_steps, &sk);
		if (!s || s->kind != STEP_BLOCK) {
			// A tier's default deny, or a hole (a bug or a torn write): fail closed.
			e->verdict = TC_ACT_SHOT;
			e->kind = s ? EV_TIER_END : EV_FAIL;
			e->at_step = at;
			return 1;
		}
		__u32 id = s->block;
		struct block *b = bpf_map_lookup_elem(&mgy_blocks, &id);
		if (!b) {
			e->verdict = TC_ACT_SHOT;
			e->kind = EV_FAIL;
			return 1;
		}
		e->blk_slot = b->slot;
		e->blk_count = b->count;
		e->rule = 0;
		e->pass_to = s->pass_to;
		e->step = at + 1;
		return 0;
	hole:
		e->verdict = TC_ACT_SHOT;
		e->kind = EV_FAIL;
		return 1;
	}
	if (e->rule >= MAX_RULES) {
		e->verdict = TC_ACT_SHOT;
		e->kind = EV_FAIL;
		return 1;
	}
	struct rule_key k = {.slot = e->blk_slot, .idx = e->rule};
	struct rule *r = bpf_map_lookup_elem(&mgy_rules, &k);
	if (!r) {
		e->verdict = TC_ACT_SHOT;
		e->kind = EV_FAIL;
		return 1;
	}
	if (!rule_matches(r, &e->p)) {
		e->rule++;
		return 0;
	}
	e->rule_index = r->rule_index;
	switch (r->action) {
	case ACT_ALLOW:
		e->verdict = TC_ACT_OK;
		e->decided = 1;
		e->kind = EV_RULE;
		return 1;
	case ACT_PASS:
		// Only forward: evaluation always ends within the loop bound.
		if (e->pass_to > e->step)
			e->step = e->pass_to;
		e->rule = e->blk_count;
		return 0;
	case ACT_LOG:
		// Calico's Log: the packet is logged and evaluation continues.
		if (e->flow_logs)
			emit(&e->p, e->ifindex, e->hook, EV_RULE, ACT_LOG, e->blk_slot, e->rule,
			     r->rule_index, 0, e->len);
		e->rule++;
		return 0;
	default:
		e->verdict = TC_ACT_SHOT;
		e->decided = 1;
		e->kind = EV_RULE;
		return 1;
	}
}

static __always_inline void count_rule(struct eval *e, __u32 len)
{
	struct rule_key k = {.slot = e->blk_slot, .idx = e->rule};
	struct counter *c = bpf_map_lookup_elem(&mgy_counters, &k);
	if (c) {
		c->packets++;
		c->bytes += len;
	} else {
		struct counter n = {.packets = 1, .bytes = len};
		bpf_map_update_elem(&mgy_counters, &k, &n, BPF_NOEXIST);
	}
}

static __always_inline int parse(struct __sk_buff *skb, struct pkt *p)
{
	struct iphdr ip;
	if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)) < 0)
		return -1;
	if (ip.version != 4 || ip.ihl < 5)
		return -1;
	p->saddr = ip.saddr;
	p->daddr = ip.daddr;
	p->proto = ip.protocol;
	__u32 l4 = ETH_HLEN + ip.ihl * 4;
	// Later fragments carry no transport header: they are judged without ports (coarse).
	int later_frag = (bpf_ntohs(ip.frag_off) & 0x1fff) != 0;
	if (later_frag)
		return 0;
	switch (ip.protocol) {
	case IPPROTO_TCP: {
		__u8 h[14];
		if (bpf_skb_load_bytes(skb, l4, h, sizeof(h)) < 0)
			return -1;
		// Ports stay in network order, as the other protocols' are.
		__builtin_memcpy(&p->sport, &h[0], 2);
		__builtin_memcpy(&p->dport, &h[2], 2);
		p->tcp_flags = h[13];
		p->has_ports = 1;
		break;
	}
	case IPPROTO_UDP:
	case IPPROTO_SCTP:
	case IPPROTO_UDPLITE: {
		__u16 ports[2];
		if (bpf_skb_load_bytes(skb, l4, ports, sizeof(ports)) < 0)
			return -1;
		p->sport = ports[0];
		p->dport = ports[1];
		p->has_ports = 1;
		break;
	}
	case IPPROTO_ICMP: {
		__u8 h[8];
		if (bpf_skb_load_bytes(skb, l4, h, sizeof(h)) < 0)
			return -1;
		p->icmp_type = h[0];
		p->icmp_code = h[1];
		// Echo request (8) and reply (0): the identifier keys the flow on both sides.
		if (h[0] == 8 || h[0] == 0) {
			__u16 id = (__u16)h[4] | ((__u16)h[5] << 8);
			p->sport = id;
			p->dport = id;
		}
		break;
	}
	}
	return 0;
}

static __always_inline __u64 ct_timeout(__u8 proto, __u32 flags)
{
	switch (proto) {
	case IPPROTO_TCP:
		if (flags & CT_RST)
			return CT_TCP_RESET_SEEN;
		if ((flags & (CT_FIN_FWD | CT_FIN_REV)) == (CT_FIN_FWD | CT_FIN_REV))
			return CT_TCP_FINS_SEEN;
		if (flags & CT_REPLY_SEEN)
			return CT_TCP_ESTABLISHED;
		return CT_TCP_SYN_SENT;
	case IPPROTO_UDP:
		return CT_UDP;
	case IPPROTO_ICMP:
		return CT_ICMP;
	default:
		return CT_GENERIC;
	}
}

static __always_inline int policy(struct __sk_buff *skb, __u8 hook)
{
	if (skb->protocol == bpf_htons(ETH_P_ARP))
		return TC_ACT_OK;
	__u32 ifindex = skb->ifindex;
	struct endpoint *ep = bpf_map_lookup_elem(&mgy_eps, &ifindex);
	if (!ep)
		return TC_ACT_SHOT; // an interface with a program but no endpoint: fail closed
	if (skb->protocol != bpf_htons(ETH_P_IP))
		return TC_ACT_SHOT; // IPv6 and anything else: not supported in this milestone

	struct pkt p = {};
	if (parse(skb, &p) < 0)
		return TC_ACT_SHOT;

	__u64 now = bpf_ktime_get_ns();
	struct ct_key fwd = {.ifindex = ifindex, .saddr = p.saddr, .daddr = p.daddr,
			     .sport = p.sport, .dport = p.dport, .proto = p.proto, .hook = hook};
	struct ct_val *cv = bpf_map_lookup_elem(&mgy_ct, &fwd);
	int reply = 0;
	if (!cv) {
		// A reply: the reverse flow was judged on this interface by the other hook.
		struct ct_key rev = {.ifindex = ifindex, .saddr = p.daddr, .daddr = p.saddr,
				     .sport = p.dport, .dport = p.sport, .proto = p.proto,
				     .hook = hook ^ 1};
		cv = bpf_map_lookup_elem(&mgy_ct, &rev);
		reply = 1;
	}
	// A TCP SYN (without ACK) never reuses a closing or closed flow's entry: the new
	// connection on the same ports is judged by policy.
	int syn = p.proto == IPPROTO_TCP && (p.tcp_flags & (TCP_SYN | TCP_ACK)) == TCP_SYN;
	if (cv && !(syn && (cv->flags & (CT_FIN_FWD | CT_FIN_REV | CT_RST)))) {
		if (now - cv->last_seen_ns <= ct_timeout(cv->proto, cv->flags)) {
			cv->last_seen_ns = now;
			__u32 set = reply ? CT_REPLY_SEEN : 0;
			if (p.proto == IPPROTO_TCP) {
				if (p.tcp_flags & TCP_RST)
					set |= CT_RST;
				if (p.tcp_flags & TCP_FIN)
					set |= reply ? CT_FIN_REV : CT_FIN_FWD;
			}
			// Flags are only ever set; an atomic OR keeps two CPUs from losing one.
			if (set && (cv->flags & set) != set)
				__sync_fetch_and_or(&cv->flags, set);
			return TC_ACT_OK;
		}
	}

	// Traffic the host itself sends to a workload (it never arrived on an interface) is not
	// judged by the workload's ingress policy, as with the nftables dataplane (no output
	// hook); it is recorded so the workload's replies pass its egress hook.
	if (!(hook == HOOK_TO_WL && skb->ingress_ifindex == 0)) {
		__u32 z = 0;
		__u32 *on = bpf_map_lookup_elem(&mgy_flow_cfg, &z);
		struct eval *e = bpf_map_lookup_elem(&mgy_eval, &z);
		if (!e)
			return TC_ACT_SHOT;
		__builtin_memset(e, 0, sizeof(*e));
		e->p = p;
		e->ep_slot = ep->slot[hook & 1];
		e->nsteps = ep->count[hook & 1];
		e->verdict = -1;
		e->kind = EV_NO_MATCH;
		e->ifindex = ifindex;
		e->len = skb->len;
		e->hook = hook;
		e->flow_logs = on && *on;
		// The hook's index, if it has one: only the blocks that can match this
		// packet's (protocol, destination port) are walked.
		struct rule_key ik = {.slot = e->ep_slot, .idx = INDEX_BASE};
		struct step *d = bpf_map_lookup_elem(&mgy_steps, &ik);
		if (d && d->kind == STEP_INDEX) {
			e->indexed = 1;
			e->d_pos = d->block;
			e->d_end = d->block + d->pass_to;
			if (p.has_ports) {
				ik.idx = INDEX_BASE | ((__u32)p.proto << 16) | bpf_ntohs(p.dport);
				struct step *k = bpf_map_lookup_elem(&mgy_steps, &ik);
				if (k && k->kind == STEP_INDEX) {
					e->k_pos = k->block;
					e->k_end = k->block + k->pass_to;
				}
			}
		}
		bpf_loop(MAX_RULES, eval_step, 0, 0);
		if (e->decided)
			count_rule(e, skb->len);
		if (e->flow_logs)
			emit(&p, ifindex, hook, e->kind,
			     e->verdict == TC_ACT_OK ? ACT_ALLOW : ACT_DENY, e->blk_slot, e->rule,
			     e->rule_index, e->at_step, skb->len);
		if (e->verdict != TC_ACT_OK)
			return TC_ACT_SHOT; // denied, or no rule decided: default deny
	}
	struct ct_val nv = {.last_seen_ns = now, .proto = p.proto};
	if (p.proto == IPPROTO_TCP && (p.tcp_flags & TCP_RST))
		nv.flags = CT_RST;
	bpf_map_update_elem(&mgy_ct, &fwd, &nv, BPF_ANY);
	return TC_ACT_OK;
}

SEC("classifier")
int mgy_from_wl(struct __sk_buff *skb)
{
	return policy(skb, HOOK_FROM_WL);
}

SEC("classifier")
int mgy_to_wl(struct __sk_buff *skb)
{
	return policy(skb, HOOK_TO_WL);
}

// No GPL-only helper is used.
char LICENSE[] SEC("license") = "Apache-2.0";
