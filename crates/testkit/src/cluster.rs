//! A private Redis Cluster: a few masters on free ports, the 16,384 slots shared among them,
//! ready once every node reports `cluster_state:ok`.
//!
//! The cluster is built with plain `CLUSTER` commands, as `redis-cli --cluster create` does
//! underneath, so the harness needs neither redis-cli nor a Redis client: each node takes a
//! distinct config epoch and a contiguous range of slots (`CLUSTER ADDSLOTSRANGE`), then the
//! first node meets the others and gossip spreads the slot map.

use std::net::SocketAddr;

use crate::error::{Error, Result};
use crate::process::{STARTUP_TIMEOUT, wait_for};
use crate::redis::{RedisOptions, RedisServer};
use crate::resp::{self, Reply};

/// The number of hash slots of every Redis Cluster.
pub const CLUSTER_SLOTS: u16 = 16_384;

/// A Redis Cluster of masters without replicas, every node in its own temporary folder.
/// Every node is killed on drop.
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts `masters` nodes (at least 1), node `i` serving the `i`-th of `masters` equal slot
    /// ranges, and returns once every node sees all slots served and all nodes known.
    pub fn start(masters: usize) -> Result<Self> {
        if masters == 0 || masters > usize::from(CLUSTER_SLOTS) {
            return Err(Error::Cluster(format!(
                "needs between 1 and {CLUSTER_SLOTS} masters, not {masters}"
            )));
        }
        let nodes = (0..masters)
            .map(|_| RedisServer::start_with(RedisOptions::default().cluster()))
            .collect::<Result<Vec<_>>>()?;
        let cluster = RedisCluster { nodes };
        for (i, node) in cluster.nodes.iter().enumerate() {
            // Distinct epochs spare the nodes a round of epoch-collision resolution.
            ask(
                node.addr(),
                &["CLUSTER", "SET-CONFIG-EPOCH", &(i + 1).to_string()],
            )?;
            let (first, last) = slot_range(i, masters);
            ask(
                node.addr(),
                &[
                    "CLUSTER",
                    "ADDSLOTSRANGE",
                    &first.to_string(),
                    &last.to_string(),
                ],
            )?;
        }
        let first = cluster.nodes[0].addr();
        for node in &cluster.nodes[1..] {
            let bus = node.cluster_bus_port().map(|p| p.to_string());
            let mut meet = vec![
                "CLUSTER".to_owned(),
                "MEET".to_owned(),
                node.addr().ip().to_string(),
                node.port().to_string(),
            ];
            meet.extend(bus);
            let meet: Vec<&str> = meet.iter().map(String::as_str).collect();
            ask(first, &meet)?;
        }
        cluster.wait_until_ok()?;
        Ok(cluster)
    }

    /// The nodes, node `i` serving slot range `i`.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// Node `index`, to kill or restart it.
    pub fn node_mut(&mut self, index: usize) -> Option<&mut RedisServer> {
        self.nodes.get_mut(index)
    }

    /// The nodes as `redis://127.0.0.1:PORT` URLs, the seed list a cluster client takes.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The nodes' addresses.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.nodes.iter().map(RedisServer::addr).collect()
    }

    /// The first and last slot that node `index` serves.
    pub fn slot_range(&self, index: usize) -> (u16, u16) {
        slot_range(index, self.nodes.len())
    }

    /// The index of the node serving `slot`.
    pub fn node_for_slot(&self, slot: u16) -> usize {
        (0..self.nodes.len())
            .find(|&i| {
                let (first, last) = self.slot_range(i);
                (first..=last).contains(&slot)
            })
            .unwrap_or(self.nodes.len() - 1)
    }

    /// A field of `CLUSTER INFO` as node `index` reports it, e.g. `cluster_state`.
    pub fn info_field(&self, index: usize, field: &str) -> Option<String> {
        cluster_info_field(self.nodes.get(index)?.addr(), field)
    }

    fn wait_until_ok(&self) -> Result<()> {
        let masters = self.nodes.len().to_string();
        let ready = |addr: SocketAddr| {
            cluster_info_field(addr, "cluster_state").as_deref() == Some("ok")
                && cluster_info_field(addr, "cluster_known_nodes").as_deref()
                    == Some(masters.as_str())
        };
        wait_for(
            || {
                let states: Vec<String> = self
                    .nodes
                    .iter()
                    .map(|n| {
                        let field = |f| cluster_info_field(n.addr(), f).unwrap_or("?".into());
                        format!(
                            "{} is {} and knows {} nodes",
                            n.addr(),
                            field("cluster_state"),
                            field("cluster_known_nodes")
                        )
                    })
                    .collect();
                format!("the cluster to be ok ({})", states.join("; "))
            },
            STARTUP_TIMEOUT,
            || self.nodes.iter().all(|n| ready(n.addr())).then_some(()),
        )
    }
}

/// Slots `[first, last]` of node `index` of `nodes`: equal shares, the remainder spread over
/// the first nodes.
fn slot_range(index: usize, nodes: usize) -> (u16, u16) {
    let total = usize::from(CLUSTER_SLOTS);
    let start = |i: usize| i * total / nodes;
    // Both values are below 16,384, so the conversions cannot fail.
    let first = u16::try_from(start(index)).unwrap_or(0);
    let last = u16::try_from(start(index + 1) - 1).unwrap_or(CLUSTER_SLOTS - 1);
    (first, last)
}

/// Sends `args` to `addr` and fails on an error reply.
fn ask(addr: SocketAddr, args: &[&str]) -> Result<Reply> {
    let reply = resp::command(addr, args)
        .map_err(|e| Error::io(format!("sending {} to {addr}", args.join(" ")), e))?;
    match reply {
        Reply::Error(message) => Err(Error::Cluster(format!(
            "node {addr} refused `{}`: {message}",
            args.join(" ")
        ))),
        reply => Ok(reply),
    }
}

fn cluster_info_field(addr: SocketAddr, field: &str) -> Option<String> {
    let info = resp::command(addr, &["CLUSTER", "INFO"]).ok()?.text()?;
    let prefix = format!("{field}:");
    info.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .map(|value| value.trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_ranges_cover_every_slot_once() {
        for nodes in [1, 3, 5, 7] {
            let mut next = 0;
            for i in 0..nodes {
                let (first, last) = slot_range(i, nodes);
                assert_eq!(first, next, "{nodes} nodes");
                assert!(last >= first);
                next = last + 1;
            }
            assert_eq!(next, CLUSTER_SLOTS, "{nodes} nodes");
        }
        assert_eq!(slot_range(0, 3), (0, 5460));
        assert_eq!(slot_range(2, 3), (10922, 16383));
    }
}
