//! The Typha wire protocol (pure): frames and messages. `PROTOCOL.md` in this crate is the
//! normative description; this module is its only implementation.
//!
//! A frame is `u32 length (big-endian) | u8 type | u8 flags | payload`, where `length` counts
//! the type, flags and payload bytes. Flag bit 0 says the payload is snappy-compressed (raw
//! snappy, one block per frame, so a compressed frame can be computed once and written to
//! every client). Payload fields are unsigned LEB128 varints, zig-zag varints for signed
//! numbers, and length-prefixed byte strings.
//!
//! Decoding never trusts a length: every count and size is checked against the bytes that are
//! actually there and against the frame limit before anything is allocated, and the memory of
//! the decoded message itself (vectors, strings) is charged against the limit as it is built.
//! So a malformed or hostile frame costs at most `max` bytes for its body, `max` for its
//! decompressed payload and `max` for what it decodes to, and yields an error, never a panic.

use bytes::{BufMut, Bytes, BytesMut};
use margay_datastore::SyncStatus;

/// The protocol version this build speaks (the newest it speaks).
pub const PROTOCOL_VERSION: u32 = 1;
/// The oldest version this build still speaks.
pub const MIN_PROTOCOL_VERSION: u32 = 1;
/// `u32 length | u8 type | u8 flags`.
pub const HEADER_LEN: usize = 6;
/// The payload is raw-snappy compressed.
pub const FLAG_SNAPPY: u8 = 0b0000_0001;
/// Calico's limit on what a server accepts from a client in one message (1 MiB).
pub const DEFAULT_MAX_SERVER_INBOUND: usize = 1 << 20;
/// What a client accepts in one frame (after decompression): a KV batch holds at most 100
/// values, but one value may be large.
pub const DEFAULT_MAX_CLIENT_INBOUND: usize = 16 << 20;
/// The largest frame a server reads from a client (the hello and pongs are all a client
/// sends; a hello with a 253-byte hostname is well under 1 KiB).
pub const MAX_CLIENT_FRAME: usize = 16 << 10;

/// The largest value a server may put in a KV frame under `key` so that the frame stays
/// within what clients accept ([`DEFAULT_MAX_CLIENT_INBOUND`]): the count, the key, its
/// length, the kind, the revision and the value's length take at most 32 bytes more.
pub fn max_served_value(key: &str) -> usize {
    DEFAULT_MAX_CLIENT_INBOUND.saturating_sub(key.len() + 32)
}

/// Compression names used in the hello messages.
pub const COMPRESSION_SNAPPY: &str = "snappy";
/// Capability: the client understands `Migrate` (moves to another Typha without a gap).
pub const CAP_MIGRATE: &str = "migrate";
/// Capability: this connection is a migration away from an over-full Typha; a Typha that is
/// itself full refuses it (error code `full`) so that the client tries the next one.
pub const CAP_MIGRATING: &str = "migrating";

/// Error codes carried by [`Message::Error`].
pub mod codes {
    pub const VERSION_MISMATCH: &str = "version-mismatch";
    pub const UNKNOWN_SYNCER_TYPE: &str = "unknown-syncer-type";
    pub const BAD_HELLO: &str = "bad-hello";
    pub const FULL: &str = "full";
    pub const SHUTTING_DOWN: &str = "shutting-down";
    /// TLS: the client's certificate chain is valid but its CN / URI SAN is not accepted.
    pub const CERTIFICATE_REFUSED: &str = "certificate-refused";
    /// The client fell more than MaxFallBehind behind.
    pub const FELL_BEHIND: &str = "fell-behind";
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum MsgType {
    ClientHello = 1,
    ServerHello = 2,
    Error = 3,
    Kvs = 4,
    SyncStatus = 5,
    Ping = 6,
    Pong = 7,
    Migrate = 8,
}

impl MsgType {
    fn from_u8(b: u8) -> Option<MsgType> {
        Some(match b {
            1 => MsgType::ClientHello,
            2 => MsgType::ServerHello,
            3 => MsgType::Error,
            4 => MsgType::Kvs,
            5 => MsgType::SyncStatus,
            6 => MsgType::Ping,
            7 => MsgType::Pong,
            8 => MsgType::Migrate,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientHello {
    /// The range of protocol versions the client speaks.
    pub min_version: u32,
    pub max_version: u32,
    pub hostname: String,
    /// Free text for logs (e.g. `margay felix 0.1.0`).
    pub info: String,
    /// `felix` or `bgp`.
    pub syncer_type: String,
    /// Compressions the client accepts, preferred first.
    pub compression: Vec<String>,
    pub capabilities: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerHello {
    /// The version chosen for the connection.
    pub version: u32,
    pub syncer_type: String,
    /// Which Typha this is (for logs; `host:port/pid`).
    pub server_id: String,
    /// The compression the server will use for KV batches ("" = none).
    pub compression: String,
    pub capabilities: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateKind {
    New,
    Updated,
    Deleted,
}

/// One change to one key. `value` is the stored bytes (the resource's JSON); None deletes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kv {
    pub key: String,
    pub value: Option<Bytes>,
    /// The datastore revision of the change.
    pub revision: i64,
    pub kind: UpdateKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    ClientHello(ClientHello),
    ServerHello(ServerHello),
    /// Sent before closing: why the connection is refused or ends.
    Error {
        code: String,
        message: String,
    },
    Kvs(Vec<Kv>),
    /// Everything up to datastore revision `as_of` has been sent; the upstream syncer's
    /// status is `status`.
    SyncStatus {
        status: SyncStatus,
        as_of: i64,
    },
    Ping(u64),
    Pong(u64),
    /// The server asks the client to move to another Typha within `grace_ms`.
    Migrate {
        grace_ms: u64,
        reason: String,
    },
}

impl Message {
    pub fn msg_type(&self) -> MsgType {
        match self {
            Message::ClientHello(_) => MsgType::ClientHello,
            Message::ServerHello(_) => MsgType::ServerHello,
            Message::Error { .. } => MsgType::Error,
            Message::Kvs(_) => MsgType::Kvs,
            Message::SyncStatus { .. } => MsgType::SyncStatus,
            Message::Ping(_) => MsgType::Ping,
            Message::Pong(_) => MsgType::Pong,
            Message::Migrate { .. } => MsgType::Migrate,
        }
    }
}

/// Why bytes are not a valid frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    #[error(
        "frame of {len} bytes exceeds the limit of {max} bytes (a peer that is not margay typha, or a corrupt stream)"
    )]
    FrameTooLarge { len: usize, max: usize },
    #[error("empty frame (a frame holds at least its type and flags)")]
    EmptyFrame,
    #[error("unknown message type {0} (a newer peer, or not a margay typha stream)")]
    UnknownType(u8),
    #[error("unknown frame flags {0:#04x}")]
    UnknownFlags(u8),
    #[error("truncated {0}")]
    Truncated(&'static str),
    #[error("{0} is not UTF-8")]
    BadUtf8(&'static str),
    #[error("varint in {0} is longer than 64 bits")]
    VarintOverflow(&'static str),
    #[error("{count} {what} cannot fit in the {remaining} bytes left of the frame")]
    BadCount {
        what: &'static str,
        count: u64,
        remaining: usize,
    },
    #[error("invalid {what}: {value}")]
    BadValue { what: &'static str, value: u64 },
    #[error("{0} trailing bytes after the message")]
    Trailing(usize),
    #[error("snappy payload does not decompress: {0}")]
    Decompress(String),
    /// The decoded message would need more memory than the frame limit (many tiny entries).
    #[error(
        "decoding the {0} would allocate more than the frame limit allows ({1} bytes were left)"
    )]
    DecodedTooLarge(&'static str, usize),
}

/// A frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Bytes after the length field (type + flags + payload).
    pub len: usize,
}

/// Reads the length of a frame from its first four bytes, checking it against `max`
/// (`max` bounds the payload; type and flags come on top).
pub fn parse_len(bytes: [u8; 4], max: usize) -> Result<Header, ProtoError> {
    let len = u32::from_be_bytes(bytes) as usize;
    if len < 2 {
        return Err(ProtoError::EmptyFrame);
    }
    if len - 2 > max {
        return Err(ProtoError::FrameTooLarge { len: len - 2, max });
    }
    Ok(Header { len })
}

/// Decodes the body of a frame (type, flags, payload: the `len` bytes after the length).
pub fn decode_body(body: Bytes, max: usize) -> Result<Message, ProtoError> {
    if body.len() < 2 {
        return Err(ProtoError::EmptyFrame);
    }
    let ty = MsgType::from_u8(body[0]).ok_or(ProtoError::UnknownType(body[0]))?;
    let flags = body[1];
    if flags & !FLAG_SNAPPY != 0 {
        return Err(ProtoError::UnknownFlags(flags));
    }
    let mut payload = body.slice(2..);
    if flags & FLAG_SNAPPY != 0 {
        let n = snap::raw::decompress_len(&payload)
            .map_err(|e| ProtoError::Decompress(e.to_string()))?;
        if n > max {
            return Err(ProtoError::FrameTooLarge { len: n, max });
        }
        let out = snap::raw::Decoder::new()
            .decompress_vec(&payload)
            .map_err(|e| ProtoError::Decompress(e.to_string()))?;
        payload = Bytes::from(out);
    }
    let mut r = Reader {
        buf: payload,
        budget: max,
    };
    let msg = match ty {
        MsgType::ClientHello => Message::ClientHello(ClientHello {
            min_version: r.u32("min_version")?,
            max_version: r.u32("max_version")?,
            hostname: r.string("hostname")?,
            info: r.string("info")?,
            syncer_type: r.string("syncer_type")?,
            compression: r.strings("compression")?,
            capabilities: r.strings("capabilities")?,
        }),
        MsgType::ServerHello => Message::ServerHello(ServerHello {
            version: r.u32("version")?,
            syncer_type: r.string("syncer_type")?,
            server_id: r.string("server_id")?,
            compression: r.string("compression")?,
            capabilities: r.strings("capabilities")?,
        }),
        MsgType::Error => Message::Error {
            code: r.string("error code")?,
            message: r.string("error message")?,
        },
        MsgType::Kvs => {
            let n = r.varint("KV count")?;
            // The smallest KV is 4 bytes (empty key, kind, revision, no value).
            if n > (r.buf.len() / 4) as u64 {
                return Err(ProtoError::BadCount {
                    what: "KVs",
                    count: n,
                    remaining: r.buf.len(),
                });
            }
            // A 4-byte KV is a much larger `Kv` in memory: the vector is charged too, so a
            // frame of tiny KVs cannot make the receiver allocate many times the limit.
            r.charge(
                "KV batch",
                n.saturating_mul(std::mem::size_of::<Kv>() as u64),
            )?;
            let mut kvs = Vec::with_capacity(n as usize);
            for _ in 0..n {
                let key = r.string("KV key")?;
                let kind = match r.u8("KV kind")? {
                    0 => UpdateKind::Deleted,
                    1 => UpdateKind::New,
                    2 => UpdateKind::Updated,
                    other => {
                        return Err(ProtoError::BadValue {
                            what: "KV update kind",
                            value: other.into(),
                        });
                    }
                };
                let revision = r.i64("KV revision")?;
                let value = match kind {
                    UpdateKind::Deleted => None,
                    _ => Some(r.bytes("KV value")?),
                };
                kvs.push(Kv {
                    key,
                    value,
                    revision,
                    kind,
                });
            }
            Message::Kvs(kvs)
        }
        MsgType::SyncStatus => {
            let status = match r.u8("sync status")? {
                1 => SyncStatus::WaitForDatastore,
                2 => SyncStatus::ResyncInProgress,
                3 => SyncStatus::InSync,
                other => {
                    return Err(ProtoError::BadValue {
                        what: "sync status",
                        value: other.into(),
                    });
                }
            };
            Message::SyncStatus {
                status,
                as_of: r.i64("as_of revision")?,
            }
        }
        MsgType::Ping => Message::Ping(r.varint("ping timestamp")?),
        MsgType::Pong => Message::Pong(r.varint("pong timestamp")?),
        MsgType::Migrate => Message::Migrate {
            grace_ms: r.varint("grace")?,
            reason: r.string("reason")?,
        },
    };
    if !r.buf.is_empty() {
        return Err(ProtoError::Trailing(r.buf.len()));
    }
    Ok(msg)
}

/// Decodes every frame of a byte stream (for tests and the fuzz target): the messages, and
/// the error that stopped decoding, if any (a short final frame is `Truncated`).
pub fn decode_stream(mut data: &[u8], max: usize) -> (Vec<Message>, Option<ProtoError>) {
    let mut out = Vec::new();
    while !data.is_empty() {
        let Some(len_bytes) = data.get(..4) else {
            return (out, Some(ProtoError::Truncated("frame header")));
        };
        let mut b = [0u8; 4];
        b.copy_from_slice(len_bytes);
        let h = match parse_len(b, max) {
            Ok(h) => h,
            Err(e) => return (out, Some(e)),
        };
        let Some(body) = data.get(4..4 + h.len) else {
            return (out, Some(ProtoError::Truncated("frame body")));
        };
        match decode_body(Bytes::copy_from_slice(body), max) {
            Ok(m) => out.push(m),
            Err(e) => return (out, Some(e)),
        }
        data = &data[4 + h.len..];
    }
    (out, None)
}

struct Reader {
    buf: Bytes,
    /// Bytes the decoded message may still allocate (starts at the frame limit).
    budget: usize,
}

impl Reader {
    /// Charges `n` bytes of the decoded message's memory against the limit.
    fn charge(&mut self, what: &'static str, n: u64) -> Result<(), ProtoError> {
        match usize::try_from(n).ok().filter(|n| *n <= self.budget) {
            Some(n) => {
                self.budget -= n;
                Ok(())
            }
            None => Err(ProtoError::DecodedTooLarge(what, self.budget)),
        }
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, ProtoError> {
        let Some(&b) = self.buf.first() else {
            return Err(ProtoError::Truncated(what));
        };
        self.buf = self.buf.slice(1..);
        Ok(b)
    }

    fn varint(&mut self, what: &'static str) -> Result<u64, ProtoError> {
        let mut v: u64 = 0;
        for i in 0..10 {
            let b = self.u8(what)?;
            let low = u64::from(b & 0x7f);
            if i == 9 && low > 1 {
                return Err(ProtoError::VarintOverflow(what));
            }
            v |= low << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(ProtoError::VarintOverflow(what))
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, ProtoError> {
        let v = self.varint(what)?;
        u32::try_from(v).map_err(|_| ProtoError::BadValue { what, value: v })
    }

    fn i64(&mut self, what: &'static str) -> Result<i64, ProtoError> {
        let v = self.varint(what)?;
        Ok(((v >> 1) as i64) ^ -((v & 1) as i64))
    }

    fn bytes(&mut self, what: &'static str) -> Result<Bytes, ProtoError> {
        let n = self.varint(what)?;
        if n > self.buf.len() as u64 {
            return Err(ProtoError::Truncated(what));
        }
        let out = self.buf.slice(..n as usize);
        self.buf = self.buf.slice(n as usize..);
        Ok(out)
    }

    /// A copied string (keys, names): its bytes are charged against the limit; values stay
    /// zero-copy slices of the frame (`bytes`) and cost nothing more.
    fn string(&mut self, what: &'static str) -> Result<String, ProtoError> {
        let b = self.bytes(what)?;
        self.charge(what, b.len() as u64)?;
        String::from_utf8(b.to_vec()).map_err(|_| ProtoError::BadUtf8(what))
    }

    fn strings(&mut self, what: &'static str) -> Result<Vec<String>, ProtoError> {
        let n = self.varint(what)?;
        if n > self.buf.len() as u64 {
            return Err(ProtoError::BadCount {
                what,
                count: n,
                remaining: self.buf.len(),
            });
        }
        // Each (possibly empty) string is one wire byte but a 24-byte `String`.
        self.charge(what, n.saturating_mul(std::mem::size_of::<String>() as u64))?;
        let mut out = Vec::with_capacity(n as usize);
        for _ in 0..n {
            out.push(self.string(what)?);
        }
        Ok(out)
    }
}

fn put_varint(out: &mut BytesMut, mut v: u64) {
    while v >= 0x80 {
        out.put_u8((v as u8) | 0x80);
        v >>= 7;
    }
    out.put_u8(v as u8);
}

fn put_i64(out: &mut BytesMut, v: i64) {
    put_varint(out, ((v << 1) ^ (v >> 63)) as u64);
}

fn put_bytes(out: &mut BytesMut, b: &[u8]) {
    put_varint(out, b.len() as u64);
    out.put_slice(b);
}

fn put_strings(out: &mut BytesMut, v: &[String]) {
    put_varint(out, v.len() as u64);
    for s in v {
        put_bytes(out, s.as_bytes());
    }
}

fn status_byte(s: SyncStatus) -> u8 {
    match s {
        SyncStatus::WaitForDatastore => 1,
        SyncStatus::ResyncInProgress => 2,
        SyncStatus::InSync => 3,
    }
}

/// Appends one KV to a KV-batch payload (after its count).
fn put_kv(out: &mut BytesMut, kv: &Kv) {
    put_bytes(out, kv.key.as_bytes());
    out.put_u8(match kv.kind {
        UpdateKind::Deleted => 0,
        UpdateKind::New => 1,
        UpdateKind::Updated => 2,
    });
    put_i64(out, kv.revision);
    if kv.kind != UpdateKind::Deleted {
        put_bytes(out, kv.value.as_deref().unwrap_or_default());
    }
}

/// The payload of a message (without the frame header).
pub fn encode_payload(msg: &Message) -> BytesMut {
    let mut out = BytesMut::with_capacity(64);
    match msg {
        Message::ClientHello(h) => {
            put_varint(&mut out, h.min_version.into());
            put_varint(&mut out, h.max_version.into());
            put_bytes(&mut out, h.hostname.as_bytes());
            put_bytes(&mut out, h.info.as_bytes());
            put_bytes(&mut out, h.syncer_type.as_bytes());
            put_strings(&mut out, &h.compression);
            put_strings(&mut out, &h.capabilities);
        }
        Message::ServerHello(h) => {
            put_varint(&mut out, h.version.into());
            put_bytes(&mut out, h.syncer_type.as_bytes());
            put_bytes(&mut out, h.server_id.as_bytes());
            put_bytes(&mut out, h.compression.as_bytes());
            put_strings(&mut out, &h.capabilities);
        }
        Message::Error { code, message } => {
            put_bytes(&mut out, code.as_bytes());
            put_bytes(&mut out, message.as_bytes());
        }
        Message::Kvs(kvs) => {
            put_varint(&mut out, kvs.len() as u64);
            for kv in kvs {
                put_kv(&mut out, kv);
            }
        }
        Message::SyncStatus { status, as_of } => {
            out.put_u8(status_byte(*status));
            put_i64(&mut out, *as_of);
        }
        Message::Ping(t) | Message::Pong(t) => put_varint(&mut out, *t),
        Message::Migrate { grace_ms, reason } => {
            put_varint(&mut out, *grace_ms);
            put_bytes(&mut out, reason.as_bytes());
        }
    }
    out
}

/// A whole frame (header and payload), compressed with snappy when `compress` is set and it
/// makes the frame smaller.
pub fn encode(msg: &Message, compress: bool) -> Bytes {
    frame(msg.msg_type(), &encode_payload(msg), compress)
}

/// Frames a payload.
pub fn frame(ty: MsgType, payload: &[u8], compress: bool) -> Bytes {
    let compressed = if compress && payload.len() > 64 {
        snap::raw::Encoder::new()
            .compress_vec(payload)
            .ok()
            .filter(|c| c.len() < payload.len())
    } else {
        None
    };
    let (flags, body) = match &compressed {
        Some(c) => (FLAG_SNAPPY, c.as_slice()),
        None => (0, payload),
    };
    let mut out = BytesMut::with_capacity(HEADER_LEN + body.len());
    out.put_u32((body.len() + 2) as u32);
    out.put_u8(ty as u8);
    out.put_u8(flags);
    out.put_slice(body);
    out.freeze()
}

/// Splits KVs into KV-batch frames of at most `max_kvs` KVs and about `max_bytes` of payload
/// each (a single larger KV gets a frame of its own).
pub fn encode_kv_batches(
    kvs: impl IntoIterator<Item = Kv>,
    max_kvs: usize,
    max_bytes: usize,
    compress: bool,
) -> Vec<Bytes> {
    let mut frames = Vec::new();
    let mut body = BytesMut::new();
    let mut n = 0usize;
    let flush = |body: &mut BytesMut, n: &mut usize, frames: &mut Vec<Bytes>| {
        if *n == 0 {
            return;
        }
        let mut payload = BytesMut::with_capacity(body.len() + 5);
        put_varint(&mut payload, *n as u64);
        payload.put_slice(body);
        frames.push(frame(MsgType::Kvs, &payload, compress));
        body.clear();
        *n = 0;
    };
    for kv in kvs {
        // A KV larger than a whole batch gets a frame of its own (the one after it too, as
        // the batch is then full), so a large value is never added to other KVs: its frame
        // stays within what clients accept whenever the value does (`max_served_value`).
        let size = kv.key.len() + kv.value.as_ref().map_or(0, |v| v.len()) + 32;
        if n > 0 && size > max_bytes {
            flush(&mut body, &mut n, &mut frames);
        }
        put_kv(&mut body, &kv);
        n += 1;
        if n >= max_kvs.max(1) || body.len() >= max_bytes {
            flush(&mut body, &mut n, &mut frames);
        }
    }
    flush(&mut body, &mut n, &mut frames);
    frames
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn roundtrip(m: Message, compress: bool) {
        let f = encode(&m, compress);
        let (msgs, err) = decode_stream(&f, DEFAULT_MAX_CLIENT_INBOUND);
        assert_eq!(err, None);
        assert_eq!(msgs, vec![m]);
    }

    #[test]
    fn every_message_round_trips() {
        let kvs = vec![
            Kv {
                key: "/calico/resources/v3/projectcalico.org/ippools/p".into(),
                value: Some(Bytes::from_static(br#"{"kind":"IPPool"}"#)),
                revision: 42,
                kind: UpdateKind::New,
            },
            Kv {
                key: "/k".into(),
                value: None,
                revision: -3,
                kind: UpdateKind::Deleted,
            },
        ];
        for compress in [false, true] {
            roundtrip(
                Message::ClientHello(ClientHello {
                    min_version: 1,
                    max_version: 7,
                    hostname: "node-1".into(),
                    info: "felix".into(),
                    syncer_type: "felix".into(),
                    compression: vec!["snappy".into()],
                    capabilities: vec![CAP_MIGRATE.into()],
                }),
                compress,
            );
            roundtrip(
                Message::ServerHello(ServerHello {
                    version: 1,
                    syncer_type: "bgp".into(),
                    server_id: "t1".into(),
                    compression: String::new(),
                    capabilities: vec![],
                }),
                compress,
            );
            roundtrip(
                Message::Error {
                    code: codes::FULL.into(),
                    message: "x".repeat(200),
                },
                compress,
            );
            roundtrip(Message::Kvs(kvs.clone()), compress);
            roundtrip(
                Message::SyncStatus {
                    status: SyncStatus::InSync,
                    as_of: i64::MAX,
                },
                compress,
            );
            roundtrip(Message::Ping(u64::MAX), compress);
            roundtrip(Message::Pong(0), compress);
            roundtrip(
                Message::Migrate {
                    grace_ms: 30_000,
                    reason: "over the limit".into(),
                },
                compress,
            );
        }
    }

    #[test]
    fn batches_split_by_count_and_size() {
        let kvs: Vec<Kv> = (0..250)
            .map(|i| Kv {
                key: format!("/k/{i}"),
                value: Some(Bytes::from(vec![b'a'; 100])),
                revision: i,
                kind: UpdateKind::New,
            })
            .collect();
        let frames = encode_kv_batches(kvs.clone(), 100, 1 << 20, true);
        assert_eq!(frames.len(), 3);
        let all: Vec<u8> = frames.iter().flat_map(|f| f.iter().copied()).collect();
        let (msgs, err) = decode_stream(&all, DEFAULT_MAX_CLIENT_INBOUND);
        assert_eq!(err, None);
        let got: Vec<Kv> = msgs
            .into_iter()
            .flat_map(|m| match m {
                Message::Kvs(k) => k,
                _ => vec![],
            })
            .collect();
        assert_eq!(got, kvs);
        // Compression happened (repetitive values).
        assert!(frames[0][5] & FLAG_SNAPPY != 0);
        assert_eq!(encode_kv_batches(kvs, 1000, 1000, false).len(), 25);
    }

    #[test]
    fn a_large_kv_gets_a_frame_of_its_own() {
        let kv = |i: i64, n: usize| Kv {
            key: format!("/k/{i}"),
            value: Some(Bytes::from(vec![b'a'; n])),
            revision: i,
            kind: UpdateKind::New,
        };
        let kvs = vec![kv(1, 10), kv(2, 10), kv(3, 5000), kv(4, 10)];
        let frames = encode_kv_batches(kvs, 100, 1000, false);
        let counts: Vec<usize> = frames
            .iter()
            .map(
                |f| match decode_stream(f, DEFAULT_MAX_CLIENT_INBOUND).0.pop() {
                    Some(Message::Kvs(k)) => k.len(),
                    other => panic!("{other:?}"),
                },
            )
            .collect();
        // Before: the large KV joined the two small ones in one frame.
        assert_eq!(counts, vec![2, 1, 1]);
    }

    #[test]
    fn hostile_frames_are_errors() {
        let max = 1024;
        // Oversized.
        let (_, e) = decode_stream(&[0xff, 0xff, 0xff, 0xff, 4, 0], max);
        assert!(matches!(e, Some(ProtoError::FrameTooLarge { .. })));
        // Truncated body.
        let (_, e) = decode_stream(&[0, 0, 0, 10, 4, 0, 1], max);
        assert_eq!(e, Some(ProtoError::Truncated("frame body")));
        // Unknown type, unknown flags.
        let (_, e) = decode_stream(&[0, 0, 0, 2, 99, 0], max);
        assert_eq!(e, Some(ProtoError::UnknownType(99)));
        let (_, e) = decode_stream(&[0, 0, 0, 2, 6, 0x80], max);
        assert_eq!(e, Some(ProtoError::UnknownFlags(0x80)));
        // A KV count far beyond the bytes present allocates nothing.
        let (_, e) = decode_stream(&[0, 0, 0, 7, 4, 0, 0xff, 0xff, 0xff, 0xff, 0x0f], max);
        assert!(matches!(e, Some(ProtoError::BadCount { .. })), "{e:?}");
        // A compressed payload claiming a huge size.
        let big = snap::raw::Encoder::new()
            .compress_vec(&vec![0u8; 4096])
            .unwrap();
        let f = frame_raw(MsgType::Kvs as u8, FLAG_SNAPPY, &big);
        let (_, e) = decode_stream(&f, max);
        assert!(matches!(e, Some(ProtoError::FrameTooLarge { .. })), "{e:?}");
        // Trailing garbage inside a frame.
        let mut p = encode_payload(&Message::Ping(1)).to_vec();
        p.push(0);
        let (_, e) = decode_stream(&frame_raw(MsgType::Ping as u8, 0, &p), max);
        assert_eq!(e, Some(ProtoError::Trailing(1)));
        // Overlong varint.
        let (_, e) = decode_stream(&frame_raw(MsgType::Ping as u8, 0, &[0xff; 11]), max);
        assert!(matches!(e, Some(ProtoError::VarintOverflow(_))));
        // Bad UTF-8 key.
        let (_, e) = decode_stream(
            &frame_raw(MsgType::Error as u8, 0, &[2, 0xff, 0xfe, 0]),
            max,
        );
        assert!(matches!(e, Some(ProtoError::BadUtf8(_))));
    }

    fn frame_raw(ty: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
        let mut v = ((payload.len() + 2) as u32).to_be_bytes().to_vec();
        v.push(ty);
        v.push(flags);
        v.extend_from_slice(payload);
        v
    }
}
