//! failed_start's way to the server: a local port that refuses connections until the parent
//! opens it, then relays each connection to the server. A service pointed at a gate that stays
//! shut cannot start; one pointed at a gate opened later starts once its retries reach it.

use std::net::TcpListener as StdListener;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

use crate::BoxError;

/// A port on 127.0.0.1 that refuses connections until [`Gate::open`].
pub struct Gate {
    port: u16,
    relay: Option<JoinHandle<()>>,
}

impl Gate {
    /// A port nothing listens on (one the system just gave out and took back).
    pub fn shut() -> Result<Self, BoxError> {
        let port = StdListener::bind("127.0.0.1:0")?.local_addr()?.port();
        Ok(Self { port, relay: None })
    }

    /// The gate's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Whether the gate relays connections.
    pub fn is_open(&self) -> bool {
        self.relay.is_some()
    }

    /// From now on, relays each connection to `host:port`.
    pub async fn open(&mut self, host: &str, port: u16) -> Result<(), BoxError> {
        let listener = TcpListener::bind(("127.0.0.1", self.port))
            .await
            .map_err(|e| format!("the gate cannot listen on port {}: {e}", self.port))?;
        let target = format!("{host}:{port}");
        self.relay = Some(tokio::spawn(async move {
            // The relays end with the gate: dropping the set aborts them.
            let mut relays = JoinSet::new();
            while let Ok((mut client, _)) = listener.accept().await {
                let target = target.clone();
                relays.spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(&target).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                while relays.try_join_next().is_some() {}
            }
        }));
        Ok(())
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        if let Some(relay) = self.relay.take() {
            relay.abort();
        }
    }
}
