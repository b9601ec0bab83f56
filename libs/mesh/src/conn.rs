//! Accepted server connections: one stream type for TCP, TLS-over-TCP and Unix sockets, with
//! the peer's identity computed once per connection (at handshake time), not per request.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bigfleet_identity::{IdentityError, PeerIdentity};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::transport::server::Connected;

/// How a connection reached us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// Plain TCP (the process runs without TLS).
    Tcp,
    /// TCP with mutual TLS.
    Tls,
    /// A Unix socket: a process in the same pod, trusted by file permissions.
    Unix,
}

/// What the TLS handshake established about the client certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerCert {
    /// Not a TLS connection.
    None,
    /// TLS without a client certificate (cannot happen while client auth is required, but
    /// the identity layer refuses it explicitly rather than trusting that).
    Missing,
    /// The verified leaf's identity, or why it has none.
    Verified(Result<PeerIdentity, IdentityError>),
}

/// Per-connection facts, visible to every request as a request extension.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    pub transport: Transport,
    pub remote_addr: Option<SocketAddr>,
    pub peer_cert: Arc<PeerCert>,
}

enum Inner {
    Tcp(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
    Unix(UnixStream),
}

/// A server-side connection of any transport.
///
/// Carries a kill switch: once the server's drain deadline passes, reads fail, which makes
/// hyper drop the connection and every stream on it. (tonic's graceful shutdown alone waits
/// for long-lived streams forever.) Each connection polls its own child token so 10K
/// connections do not contend on one wait list.
pub struct MeshConn {
    inner: Inner,
    info: ConnInfo,
    kill: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl MeshConn {
    pub(crate) fn tcp(stream: TcpStream, kill: &CancellationToken) -> Self {
        let remote_addr = stream.peer_addr().ok().map(crate::listen::canonical_peer);
        Self {
            kill: Box::pin(kill.child_token().cancelled_owned()),
            inner: Inner::Tcp(stream),
            info: ConnInfo {
                transport: Transport::Tcp,
                remote_addr,
                peer_cert: Arc::new(PeerCert::None),
            },
        }
    }

    pub(crate) fn tls(
        stream: tokio_rustls::server::TlsStream<TcpStream>,
        kill: &CancellationToken,
    ) -> Self {
        let remote_addr = stream
            .get_ref()
            .0
            .peer_addr()
            .ok()
            .map(crate::listen::canonical_peer);
        let peer_cert = match stream
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
        {
            None => PeerCert::Missing,
            Some(leaf) => PeerCert::Verified(PeerIdentity::from_cert_der(leaf.as_ref())),
        };
        Self {
            kill: Box::pin(kill.child_token().cancelled_owned()),
            inner: Inner::Tls(Box::new(stream)),
            info: ConnInfo {
                transport: Transport::Tls,
                remote_addr,
                peer_cert: Arc::new(peer_cert),
            },
        }
    }

    pub(crate) fn unix(stream: UnixStream, kill: &CancellationToken) -> Self {
        Self {
            kill: Box::pin(kill.child_token().cancelled_owned()),
            inner: Inner::Unix(stream),
            info: ConnInfo {
                transport: Transport::Unix,
                remote_addr: None,
                peer_cert: Arc::new(PeerCert::None),
            },
        }
    }
}

impl Connected for MeshConn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        self.info.clone()
    }
}

// All inner streams are `Unpin`, so delegation needs no pin projection.
impl AsyncRead for MeshConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // An HTTP/2 connection always has a read pending, so checking here is enough.
        if this.kill.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "server drain deadline passed",
            )));
        }
        match &mut this.inner {
            Inner::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Inner::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Inner::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for MeshConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().inner {
            Inner::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Inner::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Inner::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().inner {
            Inner::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Inner::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
            Inner::Unix(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.inner {
            Inner::Tcp(s) => s.is_write_vectored(),
            Inner::Tls(s) => s.is_write_vectored(),
            Inner::Unix(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().inner {
            Inner::Tcp(s) => Pin::new(s).poll_flush(cx),
            Inner::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Inner::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().inner {
            Inner::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Inner::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Inner::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}
