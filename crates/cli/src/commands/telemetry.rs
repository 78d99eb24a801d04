//! `--otlp-endpoint`: the spans of Spillway's own crates to an OpenTelemetry collector over
//! OTLP/gRPC, with the `otlp` feature. Off without the flag: no exporter, no thread, and spans
//! that no subscriber takes cost one check where they are made. A build without the feature
//! refuses the flag rather than ignoring it.

use tracing_subscriber::Layer;
use tracing_subscriber::registry::LookupSpan;

/// The span exporter while it runs; dropped, it sends the spans still queued (within the
/// exporter's timeout) and stops.
pub struct Telemetry {
    #[cfg(feature = "otlp")]
    _running: Option<otlp::Running>,
}

/// The layer that takes spans for the collector, when there is one.
pub type SpanLayer<S> = Option<Box<dyn Layer<S> + Send + Sync + 'static>>;

impl Telemetry {
    /// Sends the spans still queued to the collector (within the exporter's timeout) and stops
    /// the exporter: the end of a command.
    pub fn finish(self) {
        #[cfg(feature = "otlp")]
        drop(self._running);
    }

    /// Starts the exporter to `endpoint`, naming the process `service` (or `OTEL_SERVICE_NAME`).
    pub fn start<S>(endpoint: Option<&str>, service: &str) -> Result<(Self, SpanLayer<S>), String>
    where
        S: tracing::Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
    {
        let Some(endpoint) = endpoint.filter(|e| !e.is_empty()) else {
            return Ok((
                Self {
                    #[cfg(feature = "otlp")]
                    _running: None,
                },
                None,
            ));
        };
        #[cfg(feature = "otlp")]
        {
            let (running, layer) = otlp::start(endpoint, service)?;
            Ok((
                Self {
                    _running: Some(running),
                },
                Some(layer),
            ))
        }
        #[cfg(not(feature = "otlp"))]
        {
            let _ = service;
            Err(format!(
                "this spillway was built without the `otlp` feature, so it cannot send spans to \
                 {endpoint}; build it with `cargo build --features otlp` (the default), or drop \
                 the flag and OTEL_EXPORTER_OTLP_ENDPOINT"
            ))
        }
    }
}

#[cfg(feature = "otlp")]
mod otlp {
    use std::time::Duration;

    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_otlp::WithExportConfig;
    use opentelemetry_sdk::Resource;
    use opentelemetry_sdk::propagation::TraceContextPropagator;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use tracing_subscriber::Layer;
    use tracing_subscriber::filter::Targets;
    use tracing_subscriber::registry::LookupSpan;

    /// How long one export may take, and the flush at exit with it.
    const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

    /// The crates whose spans are exported: Spillway's, not its libraries'.
    const TARGETS: [&str; 4] = [
        "spillway_rules",
        "spillway_control",
        "spillway_proxy",
        "spillway_cli",
    ];

    pub struct Running {
        provider: SdkTracerProvider,
        // The gRPC channel's connection lives on this runtime's one thread, apart from the
        // commands' own runtimes, which start and stop on their own schedule. Dropped after
        // the provider has flushed.
        _runtime: tokio::runtime::Runtime,
    }

    impl Drop for Running {
        fn drop(&mut self) {
            if let Err(err) = self.provider.shutdown() {
                eprintln!("warning: the last spans did not reach the OTLP collector: {err}");
            }
        }
    }

    pub fn start<S>(
        endpoint: &str,
        service: &str,
    ) -> Result<(Running, Box<dyn Layer<S> + Send + Sync + 'static>), String>
    where
        S: tracing::Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
    {
        let Some(rest) = endpoint.strip_prefix("http://") else {
            return Err(if endpoint.starts_with("https://") {
                format!(
                    "{endpoint}: this build speaks plain OTLP/gRPC only; send to a collector \
                     agent on the node or pod (http://127.0.0.1:4317) and let it forward over TLS"
                )
            } else {
                format!("{endpoint}: give an http:// URL, such as http://127.0.0.1:4317")
            });
        };
        if rest.is_empty() || rest.starts_with('/') {
            return Err(format!("{endpoint}: the URL names no host"));
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("spillway-otlp")
            .enable_all()
            .build()
            .map_err(|e| format!("starting the exporter's thread: {e}"))?;
        let exporter = {
            let _inside = runtime.enter();
            opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(endpoint)
                .with_timeout(EXPORT_TIMEOUT)
                .build()
                .map_err(|e| format!("{endpoint}: {e}"))?
        };
        let service = std::env::var("OTEL_SERVICE_NAME")
            .ok()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| service.to_owned());
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(Resource::builder().with_service_name(service).build())
            .build();
        let tracer = provider.tracer("spillway");
        // A request's `traceparent` (W3C trace context) parents its span.
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
        let targets = TARGETS.iter().fold(Targets::new(), |t, target| {
            t.with_target(*target, tracing::Level::INFO)
        });
        let layer = tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_filter(targets)
            .boxed();
        Ok((
            Running {
                provider,
                _runtime: runtime,
            },
            layer,
        ))
    }
}
