//! The private Redis and Sentinel instances, driven with a real Redis client.

use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use spillway_testkit::{Error, MASTER_NAME, RedisOptions, RedisSentinelSet, RedisServer};

fn connect(url: &str) -> redis::Connection {
    redis::Client::open(url)
        .expect("a valid redis URL")
        .get_connection()
        .expect("connect to the private redis-server")
}

fn info(addr: SocketAddr, section: &str) -> String {
    let mut con = connect(&format!("redis://{addr}"));
    redis::cmd("INFO").arg(section).query(&mut con).unwrap()
}

fn role(addr: SocketAddr) -> String {
    let info = info(addr, "replication");
    let line = info.lines().find(|l| l.starts_with("role:")).unwrap();
    line["role:".len()..].trim().to_owned()
}

#[test]
fn private_redis_answers_set_get_and_info() {
    let server = RedisServer::start().expect("start a private redis-server");
    let mut con = connect(&server.url());

    redis::cmd("SET")
        .arg("rl:user:alice:/search")
        .arg("7")
        .query::<()>(&mut con)
        .unwrap();
    let value: String = redis::cmd("GET")
        .arg("rl:user:alice:/search")
        .query(&mut con)
        .unwrap();
    assert_eq!(value, "7");

    let server_info = info(server.addr(), "server");
    assert!(
        server_info.contains(&format!("tcp_port:{}", server.port())),
        "INFO names our port: {server_info}"
    );
    let persistence = info(server.addr(), "persistence");
    assert!(persistence.contains("aof_enabled:0"), "{persistence}");
}

#[test]
fn killed_redis_restarts_empty_on_the_same_port() {
    let mut server = RedisServer::start().expect("start a private redis-server");
    let port = server.port();
    let mut con = connect(&server.url());
    redis::cmd("SET")
        .arg("k")
        .arg("v")
        .query::<()>(&mut con)
        .unwrap();

    server.kill();
    assert!(!server.is_running());
    assert!(
        TcpStream::connect(server.addr()).is_err(),
        "nothing listens after a kill"
    );

    server.restart().expect("restart on the same port");
    assert_eq!(server.port(), port);
    let mut con = connect(&server.url());
    let value: Option<String> = redis::cmd("GET").arg("k").query(&mut con).unwrap();
    assert_eq!(value, None, "no persistence: a crash loses the data");
}

#[test]
fn dropping_a_redis_server_kills_it_and_removes_its_folder() {
    let server = RedisServer::start().expect("start a private redis-server");
    let (addr, dir) = (server.addr(), server.dir().to_path_buf());
    assert!(dir.join("redis.log").is_file());
    drop(server);
    assert!(
        TcpStream::connect(addr).is_err(),
        "nothing listens after drop"
    );
    assert!(!dir.exists(), "{} is removed", dir.display());
}

#[test]
fn a_replica_follows_its_primary() {
    let primary = RedisServer::start().expect("start the primary");
    let replica = RedisServer::start_with(RedisOptions::default().replica_of(primary.addr()))
        .expect("start the replica");
    assert_eq!(role(replica.addr()), "slave");

    let mut con = connect(&primary.url());
    redis::cmd("SET")
        .arg("k")
        .arg("v")
        .query::<()>(&mut con)
        .unwrap();
    let mut replica_con = connect(&replica.url());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let value: Option<String> = redis::cmd("GET").arg("k").query(&mut replica_con).unwrap();
        if value.as_deref() == Some("v") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the write never reached the replica"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_bogus_option_fails_at_once_with_the_servers_complaint() {
    let started = Instant::now();
    let result = RedisServer::start_with(RedisOptions::default().arg("--no-such-option").arg("1"));
    let Err(err @ Error::Start { .. }) = result else {
        panic!("redis-server accepted a bogus option");
    };
    let message = err.to_string();
    assert!(message.contains("redis-server on port"), "{message}");
    assert!(message.contains("exited"), "{message}");
    assert!(
        message.contains("no-such-option"),
        "the log tail is included: {message}"
    );
    assert!(
        message.contains("Bad directive"),
        "the log tail is included: {message}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "no wait for a timeout"
    );
}

fn sentinel_primary(sentinel: SocketAddr) -> SocketAddr {
    let mut con = connect(&format!("redis://{sentinel}"));
    let (ip, port): (String, u16) = redis::cmd("SENTINEL")
        .arg("GET-MASTER-ADDR-BY-NAME")
        .arg(MASTER_NAME)
        .query(&mut con)
        .unwrap();
    format!("{ip}:{port}").parse().unwrap()
}

#[test]
fn every_sentinel_names_the_primary() {
    let set = RedisSentinelSet::start().expect("start the sentinel set");
    let primary = set.nodes()[0].addr();
    let replica = set.nodes()[1].addr();
    assert_eq!(set.sentinel_addrs().len(), 3);
    for sentinel in set.sentinel_addrs() {
        assert_eq!(sentinel_primary(sentinel), primary, "as told by {sentinel}");
    }
    assert_eq!(set.primary_addr().unwrap(), primary);
    assert_eq!(role(primary), "master");
    assert_eq!(role(replica), "slave");
}

#[test]
fn a_failover_that_does_not_come_says_what_each_sentinel_saw() {
    let set = RedisSentinelSet::start().expect("start the sentinel set");
    let primary = set.nodes()[0].addr();
    // The primary is alive, so no failover comes.
    let Err(Error::Timeout { what, .. }) = set.wait_for_failover(primary, Duration::from_secs(2))
    else {
        panic!("a failover from a live primary");
    };
    // Each sentinel's view (TILT either way: a loaded machine may put one in it).
    for sentinel in set.sentinel_addrs() {
        let view = format!("{sentinel} reports the primary Some({primary}), tilt ");
        assert!(
            what.contains(&format!("{view}0")) || what.contains(&format!("{view}1")),
            "{what}"
        );
    }
    // And each sentinel's log: its +monitor event, one of its few since it started.
    assert_eq!(
        what.matches("+monitor master mymaster").count(),
        set.sentinel_addrs().len(),
        "{what}"
    );
}

#[test]
fn sentinels_promote_the_replica_when_the_primary_is_killed() {
    let mut set = RedisSentinelSet::start().expect("start the sentinel set");
    let replica = set.nodes()[1].addr();
    let old = set.kill_primary().expect("kill the primary");
    assert_eq!(old, set.nodes()[0].addr());

    let new = set
        .wait_for_failover(old, Duration::from_secs(30))
        .expect("a failover within seconds");
    assert_eq!(new, replica);
    assert_eq!(role(new), "master");
    for sentinel in set.sentinel_addrs() {
        assert_eq!(sentinel_primary(sentinel), new, "as told by {sentinel}");
    }
    let mut con = connect(&format!("redis://{new}"));
    redis::cmd("SET")
        .arg("k")
        .arg("v")
        .query::<()>(&mut con)
        .unwrap();
}
