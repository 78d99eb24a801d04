//! The demo with its surge at a chosen point of a report interval: `cargo run --release -p
//! spillway-demo --example phase -- SECONDS INTERVAL_MS PHASE`, for example `12 1000 0.5`, and
//! prints the summary. `spillway demo` starts its surge wherever a quarter of the run falls.

use std::time::Duration;

use spillway_demo::{DemoOptions, run};

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let seconds: u64 = args.next().map_or(Ok(12), |s| s.parse())?;
    let interval_ms: u64 = args.next().map_or(Ok(1000), |s| s.parse())?;
    let phase: f64 = args.next().map_or(Ok(0.5), |s| s.parse())?;
    let mut options = DemoOptions::new(seconds);
    options.report_interval = Duration::from_millis(interval_ms);
    options.surge_phase = Some(phase);
    print!("{}", run(options).await?);
    Ok(())
}
