//! Arbitrary bytes into the frame decoder: it must return messages or an error, never
//! panic, and whatever it decodes must re-encode to the same message.
//!
//! (No `#![forbid(unsafe_code)]` here: `fuzz_target!` expands to the `#[no_mangle]` entry
//! point libFuzzer calls, which that lint counts as unsafe.)
#![no_main]

use libfuzzer_sys::fuzz_target;
use margay_typha::proto;

fuzz_target!(|data: &[u8]| {
    // A limit most inputs exceed (the limit checks), and the client's default (the parsers).
    for max in [300, proto::DEFAULT_MAX_CLIENT_INBOUND] {
        let (msgs, _err) = proto::decode_stream(data, max);
        for m in msgs {
            let again = proto::decode_stream(&proto::encode(&m, false), usize::MAX >> 8);
            assert_eq!(again, (vec![m], None));
        }
    }
    // The input as a frame body (type, flags, payload), as `wire::read_frame` passes it.
    let _ = proto::decode_body(bytes::Bytes::copy_from_slice(data), 4096);
});
