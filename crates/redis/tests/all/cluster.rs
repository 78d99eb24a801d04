//! Every script on a private three-master Redis Cluster: one bucket in one slot, buckets spread
//! over the nodes, exact under concurrent clients, and `EVAL` after `SCRIPT FLUSH` on every node.

use std::collections::BTreeSet;
use std::time::Duration;

use spillway_core::algo::{Kind, Rate};
use spillway_redis::{ExactAlgo, RedisKey};
use spillway_testkit::RedisCluster;

use crate::common::{admitted_concurrently, cluster_limiter, command_calls, raw};

const CLIENTS: usize = 8;
const REQUESTS_PER_CLIENT: usize = 30;

fn per_hour(n: u64) -> Rate {
    Rate::new(n, Duration::from_secs(3600)).unwrap()
}

/// The slot of `key`, as the cluster computes it.
async fn slot(cluster: &RedisCluster, key: &str) -> u16 {
    let mut con = raw(&cluster.urls()[0]).await;
    redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key)
        .query_async(&mut con)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_buckets_keys_share_a_slot_and_subjects_spread_over_the_nodes() {
    let cluster = RedisCluster::start(3).expect("private redis cluster");
    let mut slots = BTreeSet::new();
    let mut nodes = BTreeSet::new();
    for i in 0..12 {
        let key = RedisKey::new("user", &format!("user-{i}"), "/search");
        let own = slot(&cluster, key.as_str()).await;
        // The sliding log's meta hash and chunks must be in the bucket's slot, or its script is
        // refused.
        for part in ["meta", "0", "1", "4096"] {
            assert_eq!(slot(&cluster, &format!("{key}:{part}")).await, own, "{key}");
        }
        slots.insert(own);
        nodes.insert(cluster.node_for_slot(own));
    }
    assert!(slots.len() >= 10, "12 subjects in {} slots", slots.len());
    assert_eq!(nodes.len(), 3, "12 subjects on nodes {nodes:?}");
}

/// The algorithms under test, each admitting 60 units over the test and refilling less than one.
fn algorithms() -> Vec<(ExactAlgo, u64)> {
    let day = Rate::new(60, Duration::from_secs(86_400)).unwrap();
    vec![
        (ExactAlgo::token_bucket(per_hour(1), 60), 60),
        (
            ExactAlgo::LeakyBucket {
                rate: per_hour(1),
                burst: 59,
            },
            60,
        ),
        (ExactAlgo::FixedWindow { rate: day }, 60),
        (ExactAlgo::SlidingWindowLog { rate: per_hour(60) }, 60),
        (ExactAlgo::SlidingWindowCounter { rate: day }, 60),
        (
            ExactAlgo::new(Kind::Gcra, per_hour(1), Some(60)).unwrap(),
            60,
        ),
    ]
}

#[tokio::test]
async fn every_algorithm_is_exact_under_eight_concurrent_clients_on_a_cluster() {
    let cluster = RedisCluster::start(3).expect("private redis cluster");
    let algos = algorithms();
    // Bucket i on node i % 3: the first subject whose slot that node serves.
    let mut keys = Vec::new();
    let mut n = 0;
    while keys.len() < algos.len() {
        let key = RedisKey::new("org", &format!("org-{n}"), "/pay");
        n += 1;
        if cluster.node_for_slot(slot(&cluster, key.as_str()).await) == keys.len() % 3 {
            keys.push(key);
        }
    }

    // Eight clients, each with its own cluster connection, send costs 1, 2, 3, 1, ... to every
    // bucket in turn.
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let limiter = cluster_limiter(cluster.urls());
        let (algos, keys) = (algos.clone(), keys.clone());
        tasks.push(tokio::spawn(async move {
            let mut admitted = vec![0; algos.len()];
            for i in 0..REQUESTS_PER_CLIENT {
                let cost = (i % 3 + 1) as u64;
                for (b, ((algo, _), key)) in algos.iter().zip(&keys).enumerate() {
                    if limiter.decide(key, algo, cost).await.unwrap().is_allow() {
                        admitted[b] += cost;
                    }
                }
            }
            admitted
        }));
    }
    let mut admitted = vec![0; algos.len()];
    for task in tasks {
        for (total, a) in admitted.iter_mut().zip(task.await.unwrap()) {
            *total += a;
        }
    }
    let offered = (CLIENTS * REQUESTS_PER_CLIENT * 2) as u64;
    for ((algo, limit), admitted) in algos.iter().zip(admitted) {
        let kind = algo.kind().name();
        assert!(offered > 4 * limit);
        // The leaky bucket admits a weighted request while its backlog is within the
        // tolerance, so it may queue up to the largest cost (3) more; the others never exceed.
        let most = if algo.kind() == Kind::LeakyBucket {
            limit + 2
        } else {
            *limit
        };
        assert!(admitted <= most, "{kind}: admitted {admitted} > {most}");
        assert!(
            admitted + 3 > *limit,
            "{kind}: admitted {admitted} of {limit}"
        );
    }
}

#[tokio::test]
async fn decisions_go_on_after_script_flush_on_every_node() {
    let cluster = RedisCluster::start(3).expect("private redis cluster");
    let limiter = cluster_limiter(cluster.urls());
    let mut nodes = Vec::new();
    for url in cluster.urls() {
        nodes.push(raw(&url).await);
    }
    let algos: Vec<ExactAlgo> = algorithms().into_iter().map(|(algo, _)| algo).collect();
    let mut decisions = 0;
    for round in 0..3 {
        for con in &mut nodes {
            redis::cmd("SCRIPT")
                .arg("FLUSH")
                .query_async::<()>(con)
                .await
                .unwrap();
        }
        for (i, algo) in algos.iter().enumerate() {
            // A different subject each time, so the calls reach every node.
            let key = RedisKey::new("user", &format!("u-{round}-{i}"), "/flush");
            assert!(limiter.decide(&key, algo, 1).await.unwrap().is_allow());
            decisions += 1;
        }
    }
    let (mut evals, mut loads, mut used) = (0, 0, 0);
    for con in &mut nodes {
        let here = command_calls(con, "eval").await;
        evals += here;
        used += u64::from(here > 0);
        loads += command_calls(con, "script|load").await;
    }
    // A round calls each script once, right after every node lost its cache: each call got
    // NOSCRIPT from its node and went on with EVAL.
    assert!(used >= 2, "the calls reached {used} node(s)");
    assert_eq!(
        evals, decisions,
        "every call after a flush fell back to EVAL"
    );
    assert_eq!(loads, 0, "no SCRIPT LOAD: EVAL is the fallback");
}

#[tokio::test]
async fn sliding_log_spanning_chunks_is_exact_on_a_cluster() {
    // 600 units of costs 1, 2 and 3 make about 300 entries: the log spans three chunks or more,
    // all in the bucket's slot, and one script call still decides each request exactly.
    let cluster = RedisCluster::start(3).expect("private redis cluster");
    let algo = ExactAlgo::SlidingWindowLog {
        rate: per_hour(600),
    };
    let key = RedisKey::new("org", "acme", "/chunked");
    let limiters = (0..CLIENTS)
        .map(|_| cluster_limiter(cluster.urls()))
        .collect();
    let admitted = admitted_concurrently(limiters, &key, algo, 150).await;
    assert!(admitted <= 600, "admitted {admitted} > 600");
    assert!(admitted > 597, "admitted {admitted} of 600");
    let own = slot(&cluster, key.as_str()).await;
    let mut con = raw(&cluster.urls()[cluster.node_for_slot(own)]).await;
    let keys: Vec<String> = redis::cmd("CLUSTER")
        .arg("GETKEYSINSLOT")
        .arg(own)
        .arg(100)
        .query_async(&mut con)
        .await
        .unwrap();
    let chunks = keys.iter().filter(|k| *k != &format!("{key}:meta")).count();
    assert!(chunks >= 3, "{keys:?}");
    assert!(keys.contains(&format!("{key}:meta")), "{keys:?}");
}
