//! For benchmarks only, not an API: the upstream HTTP/1.1 client ([`crate::h1`]) behind a small
//! public face, so that `benches/upstream_client.rs`, an external crate, can measure it beside
//! hyper's client in the same run. It drives `h1` as `forward.rs` does: the head encoded into
//! the connection's buffer and written, the body written after it, the answer's head read, and
//! its body relayed through `Reading`, which hands the connection back for the next request.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method};
use http_body_util::BodyExt;
use tokio::net::TcpStream;

use crate::h1::{self, Conn, Outgoing, Reading, UpstreamSlot};

/// One upstream connection, kept alive across requests, spoken to by `h1`.
pub struct H1Client {
    addr: SocketAddr,
    host: HeaderValue,
    fields: HeaderMap,
    slot: Arc<UpstreamSlot>,
    connections: usize,
}

impl H1Client {
    pub fn new(addr: SocketAddr) -> Self {
        Self {
            addr,
            host: HeaderValue::from_str(&addr.to_string()).expect("an address is a valid host"),
            fields: HeaderMap::new(),
            slot: Arc::default(),
            connections: 0,
        }
    }

    /// How many connections were opened: 1 when every answer let the connection stay open.
    pub fn connections(&self) -> usize {
        self.connections
    }

    pub async fn get(&mut self, path: &str) -> io::Result<Bytes> {
        self.request(Method::GET, path, None).await
    }

    pub async fn post(&mut self, path: &str, body: Bytes) -> io::Result<Bytes> {
        self.request(Method::POST, path, Some(body)).await
    }

    async fn request(
        &mut self,
        method: Method,
        path: &str,
        body: Option<Bytes>,
    ) -> io::Result<Bytes> {
        let mut conn = match self.slot.take() {
            Some(conn) => conn,
            None => {
                let io = TcpStream::connect(self.addr).await?;
                io.set_nodelay(true)?;
                self.connections += 1;
                Conn::new(io)
            }
        };
        let outgoing = match &body {
            Some(body) => Outgoing::Length(body.len() as u64),
            None => Outgoing::Empty {
                length_field: false,
            },
        };
        h1::encode_head(
            &mut conn.head,
            &method,
            path,
            &self.fields,
            &self.host,
            outgoing,
        );
        let head = {
            let (io, read, head) = conn.parts();
            h1::write_whole(io, head).await?;
            if let Some(body) = &body {
                h1::write_whole(io, body).await?;
            }
            h1::read_head(io, read, &method, false)
                .await
                .map_err(io::Error::other)?
        };
        let Some(framing) = head.framing else {
            if head.keep {
                self.slot.keep(conn);
            }
            return Ok(Bytes::new());
        };
        let reading = Reading::new(conn, framing, head.keep, self.slot.clone());
        let collected = reading.collect().await.map_err(io::Error::other)?;
        Ok(collected.to_bytes())
    }
}
