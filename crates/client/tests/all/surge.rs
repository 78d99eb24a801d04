//! The surge guard in the real client, linked to a real aggregator and controller on loopback:
//! a 100x step is held to the host's part of the limit long before the control plane could
//! answer it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use spillway_client::control::{ControlOptions, ControlPlane, LinkOptions};
use spillway_client::{Client, NoHeaders};
use spillway_control::{Aggregator, AggregatorOptions, Controller, ControllerOptions};
use spillway_core::config::load_str;
use spillway_core::pattern::RequestAttrs;
use spillway_loop::RulesSnapshot;
use tokio::sync::watch;

/// Reports every 2 s, so the surge below (600 ms, right after an instruction) is over before
/// the control plane has heard of it; one global drop-ratio bucket of 100/s.
const RULES: &str = "version: 1\ncontrol:\n  report_interval: 2s\n  instruction_ttl: 10s\nservices:\n  api:\n    buckets:\n      - { name: all, limit: 100/s }\n";

fn request() -> RequestAttrs<'static> {
    RequestAttrs {
        procedure: Some("/search"),
        ..RequestAttrs::default()
    }
}

#[tokio::test]
async fn a_linked_client_holds_a_surge_to_its_part_before_the_control_plane_answers() {
    let any = "127.0.0.1:0".parse().unwrap();
    let snapshot = RulesSnapshot::parse(1, RULES, "test rules").unwrap();
    let (_rules_tx, rules) = watch::channel(Arc::new(snapshot));
    let controller = Controller::start(ControllerOptions::new(any, "r1", rules))
        .await
        .unwrap();
    let aggregator = Aggregator::start(AggregatorOptions::new(
        any,
        "r1",
        "z1",
        format!("http://{}", controller.local_addr()),
    ))
    .await
    .unwrap();
    let client = Arc::new(Client::new(load_str(RULES, "test rules").unwrap()).unwrap());
    let link = LinkOptions::new(
        format!("http://{}", aggregator.local_addr()),
        "h1",
        "r1",
        "z1",
    );
    let control = ControlPlane::spawn(client.clone(), ControlOptions::new(link), 0).unwrap();
    let status = control.status();

    // 20/s, steadily, until the end of the test.
    let steady = {
        let client = client.clone();
        tokio::spawn(async move {
            loop {
                client.decide(&request(), &NoHeaders);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };

    // Two instructions: the host has reported a whole interval of its steady load, and its
    // guard knows its part (alone in the scope, all of the 100/s).
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    while seen.len() < 2 {
        assert!(Instant::now() < deadline, "no instructions within 20 s");
        let last = status.last_instructions_ms();
        if last != 0 && seen.last() != Some(&last) {
            seen.push(last);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let instructed = status.last_instructions_ms();

    // 2,000/s for 600 ms (10 requests every 5 ms), right after that instruction.
    let start = Instant::now();
    let mut late = (0u32, 0u32);
    let mut during = vec![instructed];
    while start.elapsed() < Duration::from_millis(600) {
        let last = status.last_instructions_ms();
        if during.last() != Some(&last) {
            during.push(last);
        }
        for _ in 0..10 {
            let forwarded = client.decide(&request(), &NoHeaders).forwards();
            if start.elapsed() >= Duration::from_millis(300) {
                late.0 += 1;
                late.1 += u32::from(forwarded);
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // At most one instruction arrived during the surge: the controller's answer to the client's
    // surge report (`Report.surge`), computed from its rate now. Over the limit such an answer
    // holds the client as tight as its guard did or tighter, never looser, so what was admitted
    // is still the guard's doing; the next interval's instruction is later than the surge.
    assert!(
        during.len() <= 2,
        "{} instructions arrived during the surge",
        during.len() - 1
    );
    // The surge's second half: offered at 20 times the limit, admitted about the host's part
    // (100/s, 30 in 300 ms); without the guard all of it would pass.
    let (offered, admitted) = late;
    assert!(offered >= 300, "the surge offered only {offered} in 300 ms");
    assert!(
        admitted <= 120,
        "{admitted} of {offered} admitted in the surge's last 300 ms against a part of 100/s"
    );
    assert!(
        admitted >= 5,
        "{admitted} of {offered}: the guard holds the host to its part, not to nothing"
    );

    steady.abort();
    control.shutdown().await;
    aggregator.shutdown().await;
    controller.shutdown().await;
}
