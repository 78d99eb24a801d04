//! The private Redis Cluster, driven with a real Redis client: every slot served, keys answered
//! by their owner and redirected by the others.

use std::net::TcpStream;

use spillway_testkit::{CLUSTER_SLOTS, RedisCluster};

fn connect(url: &str) -> redis::Connection {
    redis::Client::open(url)
        .expect("a valid redis URL")
        .get_connection()
        .expect("connect to a private cluster node")
}

#[test]
fn three_masters_serve_every_slot_and_redirect_to_the_owner() {
    let cluster = RedisCluster::start(3).expect("start a private redis cluster");
    assert_eq!(cluster.nodes().len(), 3);
    let ports: Vec<u16> = cluster.nodes().iter().map(|n| n.port()).collect();

    for (i, url) in cluster.urls().iter().enumerate() {
        let mut con = connect(url);
        let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut con).unwrap();
        assert!(info.contains("cluster_state:ok"), "node {i}: {info}");
        assert!(info.contains("cluster_known_nodes:3"), "node {i}: {info}");
        assert!(info.contains("cluster_slots_ok:16384"), "node {i}: {info}");

        // Every node knows the whole map: three ranges, one per node, covering every slot.
        let slots: Vec<(u16, u16, Vec<redis::Value>)> = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query::<Vec<redis::Value>>(&mut con)
            .unwrap()
            .into_iter()
            .map(|range| {
                let redis::Value::Array(items) = range else {
                    panic!("a slot range is an array");
                };
                let first = redis::from_redis_value_ref(&items[0]).unwrap();
                let last = redis::from_redis_value_ref(&items[1]).unwrap();
                (first, last, items[2..].to_vec())
            })
            .collect();
        assert_eq!(slots.len(), 3, "node {i}: {slots:?}");
        let covered: u32 = slots
            .iter()
            .map(|(first, last, _)| u32::from(last - first) + 1)
            .sum();
        assert_eq!(covered, u32::from(CLUSTER_SLOTS));
        for (first, last, owner) in &slots {
            let redis::Value::Array(node) = &owner[0] else {
                panic!("a slot owner is an array");
            };
            let port: u16 = redis::from_redis_value_ref(&node[1]).unwrap();
            let index = cluster.node_for_slot(*first);
            assert_eq!(port, ports[index], "owner of {first}..={last}");
            assert_eq!(cluster.slot_range(index), (*first, *last));
        }
    }

    // Keys land on the node of their slot; the others answer MOVED with the owner's address.
    let mut owners = std::collections::BTreeSet::new();
    for user in ["alice", "bob", "carol", "dave", "erin", "frank"] {
        let key = format!("rl:{{user:{user}:/search}}");
        let mut any = connect(&cluster.urls()[0]);
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(&key)
            .query(&mut any)
            .unwrap();
        let owner = cluster.node_for_slot(slot);
        owners.insert(owner);
        let mut con = connect(&cluster.urls()[owner]);
        redis::cmd("SET")
            .arg(&key)
            .arg(user)
            .query::<()>(&mut con)
            .unwrap();
        let other = (owner + 1) % 3;
        let err = redis::cmd("GET")
            .arg(&key)
            .query::<Option<String>>(&mut connect(&cluster.urls()[other]))
            .unwrap_err();
        assert!(
            err.to_string()
                .contains(&format!("{slot} 127.0.0.1:{}", ports[owner])),
            "{err}"
        );
    }
    assert!(
        owners.len() >= 2,
        "six subjects all on one node: {owners:?}"
    );
}

#[test]
fn dropping_a_cluster_kills_every_node_and_removes_their_folders() {
    let cluster = RedisCluster::start(2).expect("start a private redis cluster");
    let addrs = cluster.addrs();
    let dirs: Vec<_> = cluster
        .nodes()
        .iter()
        .map(|n| n.dir().to_path_buf())
        .collect();
    assert!(dirs.iter().all(|d| d.join("nodes.conf").is_file()));
    assert_eq!(
        cluster.info_field(1, "cluster_state").as_deref(),
        Some("ok")
    );
    drop(cluster);
    for addr in addrs {
        assert!(TcpStream::connect(addr).is_err(), "{addr} still listens");
    }
    assert!(dirs.iter().all(|d| !d.exists()));
}

#[test]
fn a_cluster_needs_at_least_one_master() {
    let Err(err) = RedisCluster::start(0) else {
        panic!("a cluster of no masters started");
    };
    assert!(err.to_string().contains("between 1 and 16384"), "{err}");
}
