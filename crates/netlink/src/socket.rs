//! The socket: one `NETLINK_ROUTE` socket, one request at a time, every answer bounded.

use std::io;
use std::time::{Duration, Instant};

use rtnetlink::packet_core::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage,
    NetlinkPayload,
};
use rtnetlink::packet_route::RouteNetlinkMessage;
use rtnetlink::sys::protocols::NETLINK_ROUTE;
use rtnetlink::sys::{Socket, SocketAddr as NetlinkAddr};

/// How long the kernel may take to complete one answer (request or dump).
pub const TIMEOUT: Duration = Duration::from_secs(10);
/// A dump interrupted by a concurrent change (NLM_F_DUMP_INTR) is retried this many times.
const DUMP_ATTEMPTS: usize = 5;
/// Upper bound on datagrams read for one answer (a dump of thousands of routes is far less).
const MAX_DATAGRAMS: usize = 1_000_000;

/// A `NETLINK_ROUTE` socket in the network namespace of the thread that opened it.
///
/// The socket stays bound to that namespace from any thread, so a socket opened by a thread
/// that entered a container's namespace (see [`crate::netns::run_in`]) keeps working there.
pub struct Netlink {
    sock: Socket,
    seq: u32,
}

impl std::fmt::Debug for Netlink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Netlink").field("seq", &self.seq).finish()
    }
}

pub(crate) fn invalid(e: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("netlink: {e}"))
}

fn timed_out() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!("netlink: no complete answer from the kernel within {TIMEOUT:?}"),
    )
}

impl Netlink {
    /// Opens a socket in the calling thread's network namespace.
    pub fn open() -> io::Result<Netlink> {
        let mut sock = Socket::new(NETLINK_ROUTE)?;
        sock.bind_auto()?;
        sock.connect(&NetlinkAddr::new(0, 0))?;
        // Blocking with a receive timeout: the kernel handles an rtnetlink request inside
        // `send`, so the answer is normally queued already and `recv` returns at once; when
        // it is not, the thread sleeps in the kernel instead of polling.
        let secs = i64::try_from(TIMEOUT.as_secs()).unwrap_or(i64::MAX);
        let timeout = nix::sys::time::TimeVal::new(secs, 0);
        nix::sys::socket::setsockopt(&sock, nix::sys::socket::sockopt::ReceiveTimeout, &timeout)
            .map_err(io::Error::from)?;
        // Acknowledgements without a copy of the request: smaller, faster.
        sock.set_cap_ack(true)?;
        Ok(Netlink { sock, seq: 0 })
    }

    fn send(&mut self, flags: u16, msg: RouteNetlinkMessage) -> io::Result<u32> {
        self.seq = self.seq.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = flags;
        header.sequence_number = self.seq;
        let mut msg = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(msg));
        msg.finalize();
        let mut buf = vec![0u8; msg.buffer_len()];
        msg.serialize(&mut buf);
        self.sock.send(&buf, 0)?;
        Ok(self.seq)
    }

    /// Reads answers to `seq` until `on` says the answer is complete.
    fn receive(
        &mut self,
        seq: u32,
        mut on: impl FnMut(NetlinkMessage<RouteNetlinkMessage>) -> io::Result<bool>,
    ) -> io::Result<()> {
        let deadline = Instant::now() + TIMEOUT;
        for _ in 0..MAX_DATAGRAMS {
            if Instant::now() >= deadline {
                return Err(timed_out());
            }
            let data = match self.sock.recv_from_full() {
                Ok((data, _)) => data,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(timed_out());
                }
                Err(e) => return Err(e),
            };
            let mut off = 0;
            while off < data.len() {
                let m = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&data[off..])
                    .map_err(invalid)?;
                let len = m.header.length as usize;
                if len == 0 {
                    return Err(invalid("zero-length message"));
                }
                off += len.next_multiple_of(4);
                if m.header.sequence_number != seq {
                    continue;
                }
                if on(m)? {
                    return Ok(());
                }
            }
        }
        Err(invalid("the answer did not end"))
    }

    /// Sends a request with NLM_F_ACK and returns the messages the kernel answered with
    /// before its acknowledgement (a `Get` of one object answers with that object); the
    /// kernel's refusal comes back as the `io::Error` of its errno.
    pub fn exchange(
        &mut self,
        flags: u16,
        msg: RouteNetlinkMessage,
    ) -> io::Result<Vec<RouteNetlinkMessage>> {
        let seq = self.send(NLM_F_REQUEST | NLM_F_ACK | flags, msg)?;
        let mut out = Vec::new();
        self.receive(seq, |m| match m.payload {
            NetlinkPayload::Error(e) => match e.code {
                Some(_) => Err(e.to_io()),
                None => Ok(true),
            },
            NetlinkPayload::Done(done) if done.code < 0 => {
                Err(io::Error::from_raw_os_error(-done.code))
            }
            NetlinkPayload::Done(_) => Ok(true),
            NetlinkPayload::InnerMessage(inner) => {
                out.push(inner);
                Ok(false)
            }
            _ => Ok(false),
        })?;
        Ok(out)
    }

    /// Sends a request that changes something and waits for the kernel's acknowledgement.
    pub fn request(&mut self, flags: u16, msg: RouteNetlinkMessage) -> io::Result<()> {
        self.exchange(flags, msg).map(drop)
    }

    /// One dump, retried while the kernel reports it inconsistent (NLM_F_DUMP_INTR); the last
    /// attempt's result is returned even if it was interrupted too.
    pub fn dump(&mut self, request: RouteNetlinkMessage) -> io::Result<Vec<RouteNetlinkMessage>> {
        let mut last = Vec::new();
        for _ in 0..DUMP_ATTEMPTS {
            let (out, consistent) = self.dump_once(request.clone())?;
            if consistent {
                return Ok(out);
            }
            tracing::debug!("netlink dump interrupted by a concurrent change; retrying");
            last = out;
        }
        Ok(last)
    }

    fn dump_once(
        &mut self,
        request: RouteNetlinkMessage,
    ) -> io::Result<(Vec<RouteNetlinkMessage>, bool)> {
        let seq = self.send(NLM_F_REQUEST | NLM_F_DUMP, request)?;
        let mut out = Vec::new();
        let mut consistent = true;
        self.receive(seq, |m| {
            if m.header.flags & NLM_F_DUMP_INTR != 0 {
                consistent = false;
            }
            match m.payload {
                // A dump that failed part-way carries the (negative) errno in NLMSG_DONE.
                NetlinkPayload::Done(done) if done.code < 0 => {
                    Err(io::Error::from_raw_os_error(-done.code))
                }
                NetlinkPayload::Done(_) => Ok(true),
                NetlinkPayload::Error(e) if e.code.is_some() => Err(e.to_io()),
                NetlinkPayload::InnerMessage(inner) => {
                    out.push(inner);
                    Ok(false)
                }
                _ => Ok(false),
            }
        })?;
        Ok((out, consistent))
    }
}
