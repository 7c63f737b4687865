#![allow(clippy::unwrap_used)]
// The counting allocator below needs `unsafe impl GlobalAlloc`; the workspace lint is "deny"
// (not "forbid") so that this test binary, and only it, can opt in.
#![allow(unsafe_code)]
//! The frame decoder against random bytes and random mutations of valid frames: it never
//! panics, returns a message or an error, and allocates O(frame limit) whatever the frame
//! claims — measured with a counting allocator: at most the limit for a decompressed
//! payload plus the limit for the decoded message (the body itself is the caller's buffer,
//! at most the limit too). The cargo-fuzz target in `fuzz/` runs the same decoder
//! open-ended; this test keeps the property in CI.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use bytes::Bytes;
use margay_datastore::SyncStatus;
use margay_typha::proto::{
    self, ClientHello, FLAG_SNAPPY, Kv, Message, MsgType, ServerHello, UpdateKind,
};
use proptest::prelude::*;

// ---------------------------------------------------------------------------------------
// Counting allocator: per-thread bytes in use and their high-water mark (proptest runs each
// case on the test's thread, so other tests' threads do not disturb the count).

struct Counting;

thread_local! {
    static IN_USE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn note(delta: isize) {
    // try_with: the allocator runs during thread teardown too, after the cells are gone.
    let _ = IN_USE.try_with(|u| {
        let now = u.get().wrapping_add(delta);
        u.set(now);
        let _ = PEAK.try_with(|p| {
            if now > p.get() {
                p.set(now);
            }
        });
    });
}

// SAFETY: every call is forwarded unchanged to the system allocator; only sizes are noted.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is passed on as is.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            note(layout.size() as isize);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as above.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            note(layout.size() as isize);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) };
        note(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as above.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            note(new_size as isize - layout.size() as isize);
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Runs `f` and returns its result and the most memory it had allocated at once (what it
/// returns included, since that is still allocated at the end).
fn peak_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let start = IN_USE.with(Cell::get);
    PEAK.with(|p| p.set(start));
    let out = f();
    let peak = PEAK.with(Cell::get) - start;
    (out, peak.max(0) as usize)
}

/// Small fixed costs on top of the limit: a `Bytes` promotion, an error's text.
const SLACK: usize = 2048;

/// Decodes every frame of `data` one by one (as `wire::read_frame` does), checking each
/// frame's allocation; returns the decoded messages.
fn check_frames(mut data: &[u8], max: usize) -> Result<Vec<Message>, TestCaseError> {
    let mut out = Vec::new();
    while data.len() >= 4 {
        let len = [data[0], data[1], data[2], data[3]];
        let h = match proto::parse_len(len, max) {
            Ok(h) => h,
            Err(_) => break,
        };
        prop_assert!(h.len <= max + 2, "a header over the limit was accepted");
        let Some(body) = data.get(4..4 + h.len) else {
            break;
        };
        let body = Bytes::copy_from_slice(body);
        let (r, peak) = peak_of(|| proto::decode_body(body, max));
        prop_assert!(
            peak <= 2 * max + SLACK,
            "decoding a {}-byte frame allocated {peak} bytes (limit {max}): {r:?}",
            h.len
        );
        match r {
            Ok(m) => {
                // Whatever decodes re-encodes to the same message.
                let again = proto::decode_stream(&proto::encode(&m, false), usize::MAX >> 8);
                prop_assert_eq!(again, (vec![m.clone()], None));
                out.push(m);
            }
            Err(_) => break,
        }
        data = &data[4 + h.len..];
    }
    // The whole-stream decoder (the fuzz target's entry point) agrees and does not panic.
    let (msgs, _) = proto::decode_stream(data, max);
    drop(msgs);
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// Valid messages.

fn text() -> impl Strategy<Value = String> {
    "\\PC{0,24}"
}

fn kv() -> impl Strategy<Value = Kv> {
    (
        text(),
        prop::option::of(prop::collection::vec(any::<u8>(), 0..300)),
        any::<i64>(),
        any::<bool>(),
    )
        .prop_map(|(key, value, revision, updated)| {
            let kind = match (&value, updated) {
                (None, _) => UpdateKind::Deleted,
                (Some(_), false) => UpdateKind::New,
                (Some(_), true) => UpdateKind::Updated,
            };
            Kv {
                key,
                value: value.map(Bytes::from),
                revision,
                kind,
            }
        })
}

fn message() -> impl Strategy<Value = Message> {
    prop_oneof![
        (
            any::<u32>(),
            any::<u32>(),
            text(),
            text(),
            text(),
            prop::collection::vec(text(), 0..4),
            prop::collection::vec(text(), 0..4)
        )
            .prop_map(
                |(a, b, h, i, t, c, caps)| Message::ClientHello(ClientHello {
                    min_version: a,
                    max_version: b,
                    hostname: h,
                    info: i,
                    syncer_type: t,
                    compression: c,
                    capabilities: caps,
                })
            ),
        (
            any::<u32>(),
            text(),
            text(),
            text(),
            prop::collection::vec(text(), 0..4)
        )
            .prop_map(|(v, t, id, c, caps)| Message::ServerHello(ServerHello {
                version: v,
                syncer_type: t,
                server_id: id,
                compression: c,
                capabilities: caps,
            })),
        (text(), text()).prop_map(|(code, message)| Message::Error { code, message }),
        prop::collection::vec(kv(), 0..30).prop_map(Message::Kvs),
        (0u8..3, any::<i64>()).prop_map(|(s, as_of)| Message::SyncStatus {
            status: [
                SyncStatus::WaitForDatastore,
                SyncStatus::ResyncInProgress,
                SyncStatus::InSync
            ][usize::from(s)],
            as_of,
        }),
        any::<u64>().prop_map(Message::Ping),
        any::<u64>().prop_map(Message::Pong),
        (any::<u64>(), text()).prop_map(|(grace_ms, reason)| Message::Migrate { grace_ms, reason }),
    ]
}

#[derive(Debug, Clone)]
enum Mutation {
    /// XOR one byte.
    Flip(usize, u8),
    Truncate(usize),
    Insert(usize, Vec<u8>),
    /// Replace the length field.
    Length(u32),
    /// Set the flags byte (e.g. claim snappy on an uncompressed payload).
    Flags(u8),
    /// Replace the type byte.
    Type(u8),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 1u8..).prop_map(|(i, b)| Mutation::Flip(i, b)),
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), prop::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(i, b)| Mutation::Insert(i, b)),
        any::<u32>().prop_map(Mutation::Length),
        any::<u8>().prop_map(Mutation::Flags),
        any::<u8>().prop_map(Mutation::Type),
    ]
}

fn apply(frame: &mut Vec<u8>, m: &Mutation) {
    let n = frame.len();
    match m {
        Mutation::Flip(i, b) => frame[i % n] ^= b,
        Mutation::Truncate(i) => frame.truncate(i % n),
        Mutation::Insert(i, b) => {
            let at = i % (n + 1);
            frame.splice(at..at, b.iter().copied());
        }
        Mutation::Length(l) => frame[..4].copy_from_slice(&l.to_be_bytes()),
        Mutation::Flags(f) => frame[5] = *f,
        Mutation::Type(t) => frame[4] = *t,
    }
}

/// Limits from tiny (every real message is over it) to the client's default.
fn limit() -> impl Strategy<Value = usize> {
    prop_oneof![Just(16usize), Just(300), Just(4096), Just(1 << 20)]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 700,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_bytes_never_panic_and_stay_within_the_limit(
        data in prop::collection::vec(any::<u8>(), 0..2048),
        max in limit(),
    ) {
        check_frames(&data, max)?;
    }

    /// Random bytes behind a plausible header (a known type, flags 0 or snappy, a length
    /// that matches), so the payload parsers see the garbage instead of the header checks.
    #[test]
    fn random_payloads_never_panic_and_stay_within_the_limit(
        ty in 1u8..=8,
        snappy in any::<bool>(),
        payload in prop::collection::vec(any::<u8>(), 0..2048),
        max in limit(),
    ) {
        let mut f = ((payload.len() + 2) as u32).to_be_bytes().to_vec();
        f.push(ty);
        f.push(if snappy { FLAG_SNAPPY } else { 0 });
        f.extend_from_slice(&payload);
        check_frames(&f, max)?;
    }

    #[test]
    fn valid_frames_round_trip(m in message(), compress in any::<bool>()) {
        let f = proto::encode(&m, compress);
        let got = check_frames(&f, proto::DEFAULT_MAX_CLIENT_INBOUND)?;
        prop_assert_eq!(got, vec![m]);
    }

    #[test]
    fn mutated_frames_never_panic_and_stay_within_the_limit(
        msgs in prop::collection::vec(message(), 1..4),
        compress in any::<bool>(),
        mutations in prop::collection::vec(mutation(), 1..4),
        max in limit(),
    ) {
        let mut stream = Vec::new();
        for m in &msgs {
            let mut f = proto::encode(m, compress).to_vec();
            for mu in &mutations {
                if f.len() >= 6 {
                    apply(&mut f, mu);
                }
            }
            stream.extend_from_slice(&f);
        }
        check_frames(&stream, max)?;
    }
}

/// A KV batch of the smallest KVs the wire allows (4 bytes each, ~18 times that in memory)
/// is refused rather than decoded into many times the limit.
#[test]
fn tiny_kvs_cannot_multiply_memory() {
    let max = 64 << 10;
    let n = max / 4 - 4;
    let mut payload = Vec::new();
    let mut v = n as u64;
    while v >= 0x80 {
        payload.push((v as u8) | 0x80);
        v >>= 7;
    }
    payload.push(v as u8);
    for _ in 0..n {
        payload.extend_from_slice(&[0, 1, 0, 0]); // empty key, New, revision 0, empty value
    }
    let mut f = ((payload.len() + 2) as u32).to_be_bytes().to_vec();
    f.push(MsgType::Kvs as u8);
    f.push(0);
    f.extend_from_slice(&payload);
    let body = Bytes::copy_from_slice(&f[4..]);
    let (r, peak) = peak_of(|| proto::decode_body(body, max));
    assert!(
        matches!(r, Err(proto::ProtoError::DecodedTooLarge(..))),
        "{r:?}"
    );
    assert!(peak <= SLACK, "refused after allocating {peak} bytes");
    // The same batch decodes under a limit that covers its memory.
    let body = Bytes::copy_from_slice(&f[4..]);
    match proto::decode_body(body, 64 << 20) {
        Ok(Message::Kvs(kvs)) => assert_eq!(kvs.len(), n),
        other => panic!("{other:?}"),
    }
}
