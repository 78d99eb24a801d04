//! The demo's traffic: a real upstream, an open-loop load generator that sends each bucket's
//! requests through the sidecars at a scheduled rate, and the recorder of what was offered and
//! admitted, in 50 ms bins by arrival time.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::service::{Service, service_fn};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinHandle;

use crate::DemoError;

/// The width of one recorder bin.
pub const BIN: Duration = Duration::from_millis(50);

/// Starts an upstream that answers `200 ok` to everything, on `127.0.0.1:0`.
pub async fn upstream(
    stop: watch::Receiver<bool>,
) -> Result<(SocketAddr, JoinHandle<()>), DemoError> {
    let ok = service_fn(|_request: Request<Incoming>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
    });
    serve_http1("the demo upstream", stop, ok).await
}

/// Serves `service` over HTTP/1.1 on `127.0.0.1:0` (named `what` in errors) until `stop`, each
/// connection on a task of its own.
pub(crate) async fn serve_http1<S>(
    what: &str,
    stop: watch::Receiver<bool>,
    service: S,
) -> Result<(SocketAddr, JoinHandle<()>), DemoError>
where
    S: Service<Request<Incoming>, Response = Response<Full<Bytes>>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(DemoError::io(what))?;
    let addr = listener.local_addr().map_err(DemoError::io(what))?;
    let task = tokio::spawn(async move {
        let mut stop = stop;
        while let Some((stream, _)) = spillway_net::accept_or_stop(&listener, &mut stop).await {
            let _ = stream.set_nodelay(true);
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service.clone()),
            );
        }
    });
    Ok((addr, task))
}

/// What one bucket's traffic did, bin by bin.
#[derive(Debug)]
pub struct Series {
    pub offered: Vec<AtomicU64>,
    pub admitted: Vec<AtomicU64>,
    /// Answers that were neither forwarded nor a 429 (a 502, a refused connection).
    pub errors: AtomicU64,
}

impl Series {
    fn new(bins: usize) -> Self {
        Series {
            offered: (0..bins).map(|_| AtomicU64::new(0)).collect(),
            admitted: (0..bins).map(|_| AtomicU64::new(0)).collect(),
            errors: AtomicU64::new(0),
        }
    }

    /// Requests per second offered and admitted over the bins `[from, to)`.
    pub fn rates(&self, from: usize, to: usize) -> (f64, f64) {
        let to = to.min(self.offered.len());
        if to <= from {
            return (0.0, 0.0);
        }
        let sum = |v: &[AtomicU64]| {
            v[from..to]
                .iter()
                .map(|n| n.load(Ordering::Relaxed))
                .sum::<u64>()
        };
        let secs = (to - from) as f64 * BIN.as_secs_f64();
        (
            sum(&self.offered) as f64 / secs,
            sum(&self.admitted) as f64 / secs,
        )
    }
}

/// Everything the load generator measured.
#[derive(Debug)]
pub struct Recorder {
    pub start: Instant,
    pub series: Vec<Series>,
    /// Latencies in microseconds of requests the sidecars forwarded, and of direct requests.
    pub proxied_us: Mutex<Vec<u32>>,
    pub direct_us: Mutex<Vec<u32>>,
}

impl Recorder {
    pub fn new(buckets: usize, run: Duration) -> Arc<Self> {
        let bins = (run.as_millis() / BIN.as_millis()) as usize + 1;
        Arc::new(Recorder {
            start: Instant::now(),
            series: (0..buckets).map(|_| Series::new(bins)).collect(),
            proxied_us: Mutex::new(Vec::new()),
            direct_us: Mutex::new(Vec::new()),
        })
    }

    /// The bin an instant falls in.
    pub fn bin(&self, at: Instant) -> usize {
        (at.saturating_duration_since(self.start).as_millis() / BIN.as_millis()) as usize
    }
}

/// One stream of requests: a path sent round-robin through `targets` at `rate(seconds since
/// start)` requests a second.
pub struct Stream {
    pub path: String,
    pub series: usize,
    pub targets: Vec<SocketAddr>,
    /// Whether these are direct requests to the upstream (latency baseline) or proxied ones.
    pub direct: bool,
    pub rate: Box<dyn Fn(f64) -> f64 + Send + Sync>,
}

/// Runs `stream` until `end`, recording into `recorder`. Open loop: requests leave on schedule
/// whether or not earlier ones were answered, up to 512 in flight.
pub async fn run_stream(stream: Stream, recorder: Arc<Recorder>, end: Instant) {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<HttpConnector, Empty<Bytes>> =
        Client::builder(TokioExecutor::new()).build(connector);
    let in_flight = Arc::new(Semaphore::new(512));
    let stream = Arc::new(stream);
    let mut next = Instant::now();
    let mut n = 0usize;
    while next < end {
        tokio::time::sleep_until(next.into()).await;
        let t = recorder.start.elapsed().as_secs_f64();
        let rate = (stream.rate)(t).max(1.0);
        next += Duration::from_secs_f64(1.0 / rate);
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            return;
        };
        let target = stream.targets[n % stream.targets.len()];
        n += 1;
        let (client, recorder, stream) = (client.clone(), recorder.clone(), stream.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let sent = Instant::now();
            let bin = recorder.bin(sent);
            let uri = format!("http://{target}{}", stream.path);
            let request = Request::get(uri).body(Empty::new());
            let Ok(request) = request else { return };
            let answer = client.request(request).await;
            let status = match answer {
                Ok(response) => {
                    let status = response.status();
                    let _ = response.into_body().collect().await;
                    Some(status)
                }
                Err(_) => None,
            };
            let took = u32::try_from(sent.elapsed().as_micros()).unwrap_or(u32::MAX);
            if stream.direct {
                if status == Some(StatusCode::OK)
                    && let Ok(mut v) = recorder.direct_us.lock()
                {
                    v.push(took);
                }
                return;
            }
            let series = &recorder.series[stream.series];
            if let Some(slot) = series.offered.get(bin) {
                slot.fetch_add(1, Ordering::Relaxed);
            }
            match status {
                Some(StatusCode::OK) => {
                    if let Some(slot) = series.admitted.get(bin) {
                        slot.fetch_add(1, Ordering::Relaxed);
                    }
                    if let Ok(mut v) = recorder.proxied_us.lock() {
                        v.push(took);
                    }
                }
                Some(StatusCode::TOO_MANY_REQUESTS) => {}
                _ => {
                    series.errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
}
