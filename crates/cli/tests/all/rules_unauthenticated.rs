//! What a client without credentials can cost `spillway rules serve`, through the real binary:
//! a burst of made-up bearer tokens from one address (127.0.0.2; all of 127/8 is loopback) holds
//! bounded memory, is throttled, and leaves an admin at another address served; wrong secrets
//! for a real token id are throttled; a wrong token sent again costs no argon2 check.

use std::net::{IpAddr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;

use crate::support::{SPILLWAY, free_port};

const ATTACKER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2));
const ADMIN: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

/// `rules serve` on a loopback port over an SQLite store; killed when dropped.
struct Server {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    async fn start(database: &str) -> Server {
        let port = free_port();
        let child = Command::new(SPILLWAY)
            .args(["rules", "serve", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--database", database])
            .stderr(Stdio::null())
            .spawn()
            .expect("rules serve starts");
        let server = Server {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(answer) = get(ADMIN, server.addr, "/healthz", None).await
                && answer.status == 200
            {
                return server;
            }
            assert!(
                Instant::now() < deadline,
                "rules serve never became healthy"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A field of `/proc/PID/status`, in kB.
    fn status_kb(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|rest| rest.trim().trim_end_matches(" kB").parse().ok())
            .unwrap_or_else(|| panic!("no {field} in {status}"))
    }
}

struct Answer {
    status: u16,
    retry_after: Option<u64>,
    body: String,
}

/// One GET on a fresh connection from `source`, with a bearer token if given.
async fn get(
    source: IpAddr,
    addr: SocketAddr,
    path: &str,
    token: Option<&str>,
) -> std::io::Result<Answer> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(source, 0))?;
    let mut stream = socket.connect(addr).await?;
    let auth = token.map_or(String::new(), |t| format!("authorization: Bearer {t}\r\n"));
    let request =
        format!("GET {path} HTTP/1.1\r\nhost: localhost\r\n{auth}connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), stream.read_to_end(&mut raw))
        .await
        .map_err(|_| std::io::Error::other("no answer in 60 s"))??;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no status line in {text:?}")))?;
    let retry_after = head.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("retry-after")
            .then(|| value.trim().parse().ok())?
    });
    Ok(Answer {
        status,
        retry_after,
        body: body.to_owned(),
    })
}

/// A well-formed token that names no token: `spw_<32 hex>_<64 hex>`, different for each `n`.
fn made_up(n: usize) -> String {
    format!("spw_{n:032x}_{:064x}", n * 7919)
}

fn metric(body: &str, name: &str) -> f64 {
    body.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {body}"))
}

/// 512 `GET /v1/whoami` with distinct made-up tokens, 128 at a time, each on a connection of its
/// own from `source(n)`; `next` counts the requests begun. Each worker gives the (request,
/// status) pairs it saw; every refusal unchecked (429 or 503) says when to retry and why.
fn burst(
    addr: SocketAddr,
    next: Arc<std::sync::atomic::AtomicUsize>,
    source: fn(usize) -> IpAddr,
) -> Vec<tokio::task::JoinHandle<Vec<(usize, u16)>>> {
    (0..128)
        .map(|_| {
            let next = next.clone();
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                loop {
                    let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if n >= 512 {
                        return statuses;
                    }
                    let answer = get(source(n), addr, "/v1/whoami", Some(&made_up(n)))
                        .await
                        .expect("an answer to each made-up token");
                    if matches!(answer.status, 429 | 503) {
                        assert!(
                            answer.retry_after.is_some_and(|s| s >= 1),
                            "a {} says when to retry",
                            answer.status
                        );
                        if answer.status == 503 {
                            assert_eq!(answer.retry_after, Some(1), "a busy queue says 1 s");
                        }
                        let kind = if answer.status == 503 {
                            "auth-busy"
                        } else {
                            "auth-throttled"
                        };
                        assert!(
                            answer
                                .body
                                .contains(&format!("urn:spillway:problem:{kind}")),
                            "{}",
                            answer.body
                        );
                    }
                    statuses.push((n, answer.status));
                }
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_of_made_up_tokens_holds_bounded_memory_and_an_admin_elsewhere_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let database = format!("sqlite://{}", dir.path().join("rules.db").display());
    // Never used before the burst: its check waits in the same queue as the attacker's.
    let admin = crate::support::up::user(&database, "alice", "admin");
    let server = Server::start(&database).await;
    let before = server.status_kb("VmHWM");

    // 512 requests, 128 at a time, each on its own connection.
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let workers = burst(server.addr, next.clone(), |_| ATTACKER);
    // The admin asks while the burst runs.
    let deadline = Instant::now() + Duration::from_secs(30);
    while next.load(std::sync::atomic::Ordering::Relaxed) < 192 {
        assert!(Instant::now() < deadline, "the burst never got going");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let during = next.load(std::sync::atomic::Ordering::Relaxed) < 512;
    let asked = Instant::now();
    let answer = get(ADMIN, server.addr, "/v1/whoami", Some(&admin))
        .await
        .unwrap();
    let waited = asked.elapsed();
    assert_eq!(answer.status, 200, "the admin is served: {}", answer.body);

    let mut statuses = Vec::new();
    for worker in workers {
        statuses.extend(worker.await.unwrap());
    }
    statuses.sort_unstable();
    let refused = statuses
        .iter()
        .filter(|(_, s)| matches!(s, 429 | 503))
        .count();
    assert!(
        statuses.iter().all(|(_, s)| matches!(s, 401 | 429 | 503)),
        "{statuses:?}"
    );
    assert!(
        statuses[..511].iter().any(|(_, s)| matches!(s, 429 | 503)),
        "some made-up tokens were refused unchecked before the 512th"
    );
    let peak = server.status_kb("VmHWM");
    let after = server.status_kb("VmRSS");
    eprintln!(
        "peak RSS {before} kB before, {peak} kB after 512 made-up tokens ({refused} refused \
         unchecked); RSS {after} kB after; the admin, who asked during the burst ({during}), waited {waited:?}"
    );
    assert!(
        peak < 300 * 1024,
        "peak RSS {peak} kB: the argon2 checks are not bounded"
    );

    let metrics = get(ADMIN, server.addr, "/metrics", None).await.unwrap();
    let throttled = metric(&metrics.body, "spillway_rules_auth_throttled_total");
    let busy = metric(&metrics.body, "spillway_rules_auth_busy_total");
    assert_eq!(throttled + busy, refused as f64, "{}", metrics.body);
    assert_eq!(
        metric(&metrics.body, "spillway_rules_auth_failures_total"),
        (512 - refused) as f64,
        "{}",
        metrics.body
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn made_up_tokens_from_many_addresses_wait_in_a_short_queue_and_memory_is_returned() {
    let dir = tempfile::tempdir().unwrap();
    let database = format!("sqlite://{}", dir.path().join("rules.db").display());
    let _admin = crate::support::up::user(&database, "alice", "admin");
    let server = Server::start(&database).await;
    let before = server.status_kb("VmRSS");

    // Each request from an address of its own (127.1.X.Y): no address runs out of allowance,
    // so only the number of checks at once and the queue bound the cost.
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let workers = burst(server.addr, next, |n| {
        IpAddr::from([127, 1, (n / 200) as u8, (n % 200 + 1) as u8])
    });
    let mut statuses = Vec::new();
    for worker in workers {
        statuses.extend(worker.await.unwrap().into_iter().map(|(_, status)| status));
    }
    assert!(
        statuses.iter().all(|s| matches!(s, 401 | 503)),
        "{statuses:?}"
    );
    let busy = statuses.iter().filter(|&&s| s == 503).count();
    assert!(busy > 0, "128 at a time never found the queue full");
    let peak = server.status_kb("VmHWM");
    assert!(
        peak < 300 * 1024,
        "peak RSS {peak} kB: the argon2 checks are not bounded"
    );
    // The memory the checks freed goes back to the system within seconds of the burst.
    let grown = server.status_kb("VmRSS") - before;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut after = server.status_kb("VmRSS");
    while after > before + grown / 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        after = server.status_kb("VmRSS");
    }
    eprintln!(
        "from many addresses: {busy} of 512 refused busy; RSS {before} kB before, peak {peak} \
         kB, {} kB at the end of the burst, {after} kB later",
        before + grown
    );
    assert!(
        after <= before + grown / 2,
        "RSS {after} kB: the memory of the burst ({grown} kB) was kept"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_secrets_for_a_real_token_id_are_throttled_and_its_holder_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let database = format!("sqlite://{}", dir.path().join("rules.db").display());
    let admin = crate::support::up::user(&database, "alice", "admin");
    let server = Server::start(&database).await;
    let ok = get(ADMIN, server.addr, "/v1/whoami", Some(&admin))
        .await
        .unwrap();
    assert_eq!(ok.status, 200, "{}", ok.body);

    // `spw_<id>_<secret>`: the same id, a different secret each time, from a third address.
    let (id, _secret) = admin["spw_".len()..].split_once('_').unwrap();
    let guesser = IpAddr::from([127, 0, 0, 3]);
    let mut throttled_at = None;
    for n in 0..300 {
        let guess = format!("spw_{id}_{n:064x}");
        let answer = get(guesser, server.addr, "/v1/whoami", Some(&guess))
            .await
            .unwrap();
        match answer.status {
            401 => {}
            429 => {
                assert!(answer.retry_after.is_some_and(|s| s >= 1));
                throttled_at = Some(n);
                break;
            }
            other => panic!("wrong secret {n}: {other} {}", answer.body),
        }
    }
    let throttled_at = throttled_at.expect("300 wrong secrets for one token id met no 429");
    assert!(throttled_at <= 10, "throttled only at guess {throttled_at}");

    // The holder, who proved the secret before, is still served, from any address.
    for source in [ADMIN, guesser] {
        let answer = get(source, server.addr, "/v1/whoami", Some(&admin))
            .await
            .unwrap();
        assert_eq!(answer.status, 200, "from {source}: {}", answer.body);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_sent_again_is_refused_without_a_check() {
    let dir = tempfile::tempdir().unwrap();
    let database = format!("sqlite://{}", dir.path().join("rules.db").display());
    let _admin = crate::support::up::user(&database, "alice", "admin");
    let server = Server::start(&database).await;
    // Each check is charged to the address, whose allowance is ten: fifty answers of 401 and
    // none of 429 mean the same wrong token was checked once.
    let token = made_up(42);
    for n in 0..50 {
        let answer = get(ATTACKER, server.addr, "/v1/whoami", Some(&token))
            .await
            .unwrap();
        assert_eq!(answer.status, 401, "sending {n}: {}", answer.body);
    }
    let metrics = get(ADMIN, server.addr, "/metrics", None).await.unwrap();
    assert_eq!(
        metric(&metrics.body, "spillway_rules_auth_failures_total"),
        50.0
    );
    // A different wrong token from the same address is charged, and the address is not out
    // of allowance.
    let answer = get(ATTACKER, server.addr, "/v1/whoami", Some(&made_up(43)))
        .await
        .unwrap();
    assert_eq!(answer.status, 401, "{}", answer.body);
}
