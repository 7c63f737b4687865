//! Reading and writing frames on a byte stream (async), with the protocol's limits.

use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::proto::{self, Message, ProtoError};

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("connection closed")]
    Closed,
    #[error("connection closed in the middle of a frame (truncated frame)")]
    Truncated,
    #[error("malformed frame: {0}")]
    Malformed(#[from] ProtoError),
    #[error("read failed: {0}")]
    Io(std::io::Error),
    #[error("nothing received for {0:?}")]
    Timeout(Duration),
}

/// Reads one frame (at most `max` payload bytes).
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R, max: usize) -> Result<Message, ReadError> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut len[got..]).await {
            Ok(0) if got == 0 => return Err(ReadError::Closed),
            Ok(0) => return Err(ReadError::Truncated),
            Ok(n) => got += n,
            Err(e) => return Err(ReadError::Io(e)),
        }
    }
    let h = proto::parse_len(len, max)?;
    // The body grows with what actually arrives (at most doubling, from 8 KiB): a peer that
    // declares a large frame and sends nothing costs nothing, and one that trickles bytes
    // costs about what it sent.
    let mut body: Vec<u8> = Vec::new();
    while body.len() < h.len {
        let start = body.len();
        let want = (h.len - start).min(start.max(READ_CHUNK));
        body.resize(start + want, 0);
        match r.read(&mut body[start..]).await {
            Ok(0) => return Err(ReadError::Truncated),
            Ok(n) => body.truncate(start + n),
            Err(e) => return Err(ReadError::Io(e)),
        }
    }
    Ok(proto::decode_body(Bytes::from(body), max)?)
}

/// The first read of a frame body; later reads at most double what has arrived.
const READ_CHUNK: usize = 8 << 10;

/// Reads one frame within `timeout`.
pub async fn read_frame_timeout<R: AsyncRead + Unpin>(
    r: &mut R,
    max: usize,
    timeout: Duration,
) -> Result<Message, ReadError> {
    match tokio::time::timeout(timeout, read_frame(r, max)).await {
        Ok(r) => r,
        Err(_) => Err(ReadError::Timeout(timeout)),
    }
}

/// Why a write failed.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("write did not complete within {0:?} (the peer is not reading)")]
    Timeout(Duration),
    #[error("write failed: {0}")]
    Io(#[from] std::io::Error),
}

/// Writes one encoded frame within `timeout`.
pub async fn write_frame<W: AsyncWrite + Unpin>(
    w: &mut W,
    frame: &[u8],
    timeout: Duration,
) -> Result<(), WriteError> {
    match tokio::time::timeout(timeout, async {
        w.write_all(frame).await?;
        w.flush().await
    })
    .await
    {
        Ok(r) => Ok(r?),
        Err(_) => Err(WriteError::Timeout(timeout)),
    }
}

/// Writes several frames with as few system calls as possible (vectored writes: a crumb's
/// KV frames and its status, or several crumbs, go out in one `writev`, which matters when
/// one Typha writes every crumb to a thousand clients); every write call must make progress
/// within `timeout`, so a peer that stops reading is detected as before. Flushes at the end.
pub async fn write_frames<W: AsyncWrite + Unpin>(
    w: &mut W,
    frames: &[Bytes],
    timeout: Duration,
) -> Result<(), WriteError> {
    // Linux's IOV_MAX is 1024; a few dozen slices already amortise the call.
    const MAX_SLICES: usize = 64;
    let (mut idx, mut off) = (0usize, 0usize);
    while idx < frames.len() {
        let slices: Vec<std::io::IoSlice<'_>> = frames[idx..]
            .iter()
            .take(MAX_SLICES)
            .enumerate()
            .map(|(i, f)| std::io::IoSlice::new(if i == 0 { &f[off..] } else { &f[..] }))
            .collect();
        let mut n = match tokio::time::timeout(timeout, w.write_vectored(&slices)).await {
            Ok(Ok(0)) => return Err(WriteError::Io(std::io::ErrorKind::WriteZero.into())),
            Ok(Ok(n)) => n,
            Ok(Err(e)) => return Err(e.into()),
            Err(_) => return Err(WriteError::Timeout(timeout)),
        };
        // Advance past what was written (possibly part of a frame).
        while n > 0 && idx < frames.len() {
            let left = frames[idx].len() - off;
            if n >= left {
                n -= left;
                idx += 1;
                off = 0;
            } else {
                off += n;
                n = 0;
            }
        }
        // Skip empty frames so the loop never spins on a zero-length slice.
        while idx < frames.len() && frames[idx].len() == off {
            idx += 1;
            off = 0;
        }
    }
    match tokio::time::timeout(timeout, w.flush()).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(WriteError::Timeout(timeout)),
    }
}

/// Writes several frames (as [`write_frames`]) with one deadline for all of them: a client
/// that reads just enough to keep each write call alive cannot hold a snapshot for longer.
pub async fn write_frames_within<W: AsyncWrite + Unpin>(
    w: &mut W,
    frames: &[Bytes],
    deadline: Duration,
) -> Result<(), WriteError> {
    match tokio::time::timeout(deadline, write_frames(w, frames, deadline)).await {
        Ok(r) => r,
        Err(_) => Err(WriteError::Timeout(deadline)),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A writer that takes at most 5 bytes per call, vectored or not.
    struct Dribble(Vec<u8>);
    impl AsyncWrite for Dribble {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            let n = buf.len().min(5);
            self.0.extend_from_slice(&buf[..n]);
            std::task::Poll::Ready(Ok(n))
        }
        fn poll_flush(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
        fn poll_shutdown(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn partial_vectored_writes_keep_every_byte_in_order() {
        let frames: Vec<Bytes> = (0..200u32)
            .map(|i| Bytes::from(vec![i as u8; (i % 13) as usize]))
            .collect();
        let want: Vec<u8> = frames.iter().flat_map(|f| f.iter().copied()).collect();
        let mut w = Dribble(Vec::new());
        write_frames(&mut w, &frames, Duration::from_secs(1))
            .await
            .unwrap();
        assert_eq!(w.0, want);
    }
}
