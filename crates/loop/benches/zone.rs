//! What one interval costs a zone aggregator's core, per host: every host's report of 10
//! buckets (the last one closes the interval: the hosts are bounded against each other and
//! summed), then the controller's instructions handed to every host (one shared message, as
//! the aggregator relays a zone's drop ratios).
//!
//! `cargo bench -p spillway-loop --bench zone`; each iteration is one interval of the whole
//! zone, so divide by the hosts for a host's cost.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use spillway_loop::ZoneCore;
use spillway_proto::v1;

const BUCKETS: usize = 10;
const INTERVAL_MS: u64 = 1_000;

fn report(host: &str, sequence: u64) -> v1::Report {
    v1::Report {
        host_id: host.to_owned(),
        zone: "z1".into(),
        region: "r1".into(),
        rules_version: 0,
        sequence,
        interval_ms: INTERVAL_MS,
        buckets: (0..BUCKETS)
            .map(|b| v1::BucketCounts {
                service: "api".into(),
                bucket: format!("b{b}"),
                offered: 75 + (b as u64),
                allowed: 50,
                offered_tail: Some(19),
                hosts: Some(1),
                ..Default::default()
            })
            .collect(),
        surge: false,
    }
}

fn instructions(sequence: u64) -> v1::ZoneInstructions {
    v1::ZoneInstructions {
        instructions: Some(v1::Instructions {
            issued_at_ms: sequence * INTERVAL_MS,
            ttl_ms: 3 * INTERVAL_MS,
            interval_ms: INTERVAL_MS,
            sequence,
            buckets: (0..BUCKETS)
                .map(|b| v1::BucketInstruction {
                    service: "api".into(),
                    bucket: format!("b{b}"),
                    drop_ratio: 1 << 20,
                    scope_offered_rps: 150_000.0,
                    scope_hosts: 2_000,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }),
        bucket_ids: false,
    }
}

fn interval(c: &mut Criterion) {
    let mut group = c.benchmark_group("zone_interval");
    for hosts in [1_000usize, 2_000] {
        let names: Vec<String> = (0..hosts).map(|i| format!("host-{i}")).collect();
        let mut zone = ZoneCore::new("r1", "z1", 0);
        for (conn, name) in names.iter().enumerate() {
            zone.join(name, conn as u64);
        }
        let mut sequence = 1u64;
        group.throughput(Throughput::Elements(hosts as u64));
        group.bench_with_input(BenchmarkId::from_parameter(hosts), &hosts, |b, _| {
            b.iter_batched(
                || {
                    sequence += 1;
                    let reports: Vec<v1::Report> =
                        names.iter().map(|name| report(name, sequence)).collect();
                    (sequence, reports)
                },
                |(sequence, reports)| {
                    // Reports arrive within the interval after the one they count.
                    let now = (sequence + 1) * INTERVAL_MS + 5;
                    let mut forwarded = 0;
                    for (conn, report) in reports.into_iter().enumerate() {
                        forwarded += zone.on_report(now, conn as u64, report).len();
                    }
                    assert!(forwarded >= 1, "the last report closes the interval");
                    // As the aggregator relays them: hosts without a share of their own share
                    // one message.
                    let mut sent = Vec::with_capacity(names.len());
                    zone.on_instructions_with(now + 1, instructions(sequence), |_, message| {
                        sent.push(message)
                    });
                    sent
                },
                criterion::BatchSize::LargeInput,
            );
        });
    }
    group.finish();
}

criterion_group!(benches, interval);
criterion_main!(benches);
