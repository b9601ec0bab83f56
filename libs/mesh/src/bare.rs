//! [`BareServer`]: a plain tonic router served in its own task, with nothing of the mesh
//! stack around it, stopped by dropping the handle. For the fake provider (which stands in
//! for an out-of-tree provider, not a mesh service) and for doubles in tests; every real
//! service serves through [`crate::MeshServer`].

use std::error::Error as StdError;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_stream::Stream;
use tonic::transport::server::{Connected, Router};

/// A running bare server. Dropping it stops accepting; [`BareServer::stop`] also waits.
#[derive(Debug)]
pub struct BareServer {
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), tonic::transport::Error>>>,
}

impl BareServer {
    /// Serves `router` on the connections `incoming` yields until the handle is stopped or
    /// dropped.
    pub fn spawn<I, IO, IE>(router: Router, incoming: I) -> Self
    where
        I: Stream<Item = Result<IO, IE>> + Send + 'static,
        IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
        IO::ConnectInfo: Clone + Send + Sync + 'static,
        IE: Into<Box<dyn StdError + Send + Sync>> + 'static,
    {
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(router.serve_with_incoming_shutdown(incoming, async {
            // An error means the handle was dropped: stop just the same.
            let _ = stopped.await;
        }));
        Self {
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Stops accepting, lets open calls finish and returns how the server ended. Streams
    /// that never end on their own must be ended first, or this waits for them.
    pub async fn stop(mut self) -> Result<(), tonic::transport::Error> {
        self.stop.take();
        self.join().await
    }

    /// Waits until the server ends on its own (it only does on an error).
    pub async fn wait(mut self) -> Result<(), tonic::transport::Error> {
        self.join().await
    }

    async fn join(&mut self) -> Result<(), tonic::transport::Error> {
        match self.task.take() {
            // A panicked or cancelled serve task has nothing more to report than that it ended.
            Some(task) => task.await.unwrap_or(Ok(())),
            None => Ok(()),
        }
    }
}

impl Drop for BareServer {
    fn drop(&mut self) {
        // Dropping the sender resolves the shutdown future.
        self.stop.take();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;
    use tokio_stream::wrappers::TcpListenerStream;

    async fn bound() -> (std::net::SocketAddr, TcpListenerStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        (addr, TcpListenerStream::new(listener))
    }

    fn health_router() -> Router {
        let (_reporter, health) = tonic_health::server::health_reporter();
        tonic::transport::Server::builder().add_service(health)
    }

    #[tokio::test]
    async fn serves_until_stopped_then_refuses() {
        use tonic_health::pb::HealthCheckRequest;
        use tonic_health::pb::health_client::HealthClient;
        let (addr, incoming) = bound().await;
        let server = BareServer::spawn(health_router(), incoming);
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let answer = HealthClient::new(channel)
            .check(HealthCheckRequest::default())
            .await;
        assert!(answer.is_ok(), "the router is not served: {answer:?}");
        server.stop().await.unwrap();
        assert!(
            tokio::net::TcpStream::connect(addr).await.is_err(),
            "a stopped server still accepts"
        );
    }

    #[tokio::test]
    async fn dropping_the_handle_stops_the_server() {
        let (addr, incoming) = bound().await;
        drop(BareServer::spawn(health_router(), incoming));
        let mut refused = false;
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(addr).await.is_err() {
                refused = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(refused, "a dropped server still accepts");
    }
}
