//! Counting round trips on the wire, and moving a store to another server
//! as a failover manager's virtual address does: a TCP proxy between a
//! store and its server.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Round trips counted by a [`counting_proxy`].
#[derive(Debug, Clone)]
pub struct Flights(Arc<AtomicU64>);

impl Flights {
    /// Round trips so far, over every connection through the proxy.
    pub fn count(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// `url` with its `host:port` (what follows the `@`, up to the path) sent
/// through a new counting proxy instead, and the proxy's count.
///
/// # Panics
/// When `url` has no `user@host:port`.
pub async fn through_proxy(url: &str) -> (String, Flights) {
    let target = host_port(url).to_owned();
    let (proxy, flights) = counting_proxy(target.clone()).await;
    (url.replacen(&target, &proxy, 1), flights)
}

/// Where a [`switching_proxy`] sends the connections it accepts from now
/// on: a failover manager's virtual address, moved to the promoted server.
#[derive(Debug, Clone)]
pub struct Switch(Arc<Mutex<String>>);

impl Switch {
    /// New connections go to `url`'s `host:port` (connections already made
    /// stay where they are, and die with their server).
    ///
    /// # Panics
    /// When `url` has no `user@host:port`.
    pub fn point_to(&self, url: &str) {
        *self.0.lock().unwrap() = host_port(url).to_owned();
    }
}

/// `url` with its `host:port` sent through a new proxy that a [`Switch`]
/// can point elsewhere (to a promoted server taking the same user and
/// password), and the switch.
///
/// # Panics
/// When `url` has no `user@host:port`.
pub async fn switching_proxy(url: &str) -> (String, Switch) {
    let target = host_port(url).to_owned();
    let switch = Switch(Arc::new(Mutex::new(target.clone())));
    let (proxy, _) = proxy(switch.clone()).await;
    (url.replacen(&target, &proxy, 1), switch)
}

/// What follows the `@` of `url`, up to its path or query.
fn host_port(url: &str) -> &str {
    url.split('@')
        .nth(1)
        .and_then(|rest| rest.split(['/', '?']).next())
        .expect("a URL with user@host:port")
}

/// A TCP proxy to `target` that counts the client's flights: a write from
/// the client after the server last spoke on that connection (or its first
/// write) starts one round trip. Counted before forwarding, so the count is
/// complete by the time the client sees the answer. Returns the proxy's
/// `host:port`.
pub async fn counting_proxy(target: String) -> (String, Flights) {
    proxy(Switch(Arc::new(Mutex::new(target)))).await
}

/// A counting proxy to wherever `switch` points when a connection comes.
async fn proxy(switch: Switch) -> (String, Flights) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let flights = Arc::new(AtomicU64::new(0));
    let counter = flights.clone();
    tokio::spawn(async move {
        loop {
            let (client, _) = listener.accept().await.unwrap();
            let target = switch.0.lock().unwrap().clone();
            // A server that is gone refuses: so does the proxy (the
            // client's connection closes at once).
            let Ok(server) = TcpStream::connect(&target).await else {
                continue;
            };
            let (mut cr, mut cw) = client.into_split();
            let (mut sr, mut sw) = server.into_split();
            let client_turn = Arc::new(AtomicBool::new(false));
            let (up_turn, up_count) = (client_turn.clone(), counter.clone());
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                while let Ok(n) = cr.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    if !up_turn.swap(true, Ordering::SeqCst) {
                        up_count.fetch_add(1, Ordering::SeqCst);
                    }
                    if sw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                while let Ok(n) = sr.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    client_turn.store(false, Ordering::SeqCst);
                    if cw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    (format!("127.0.0.1:{port}"), Flights(flights))
}
