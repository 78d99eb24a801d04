//! A load client for Envoy's `ShouldRateLimit` (RLS v3), for `bench/rls/run.sh`: it drives a
//! running `spillway proxy --rls-listen` over a few HTTP/2 connections, either open loop at a
//! fixed rate (latency) or closed loop with N calls in flight (decisions per second at
//! saturation), and reads the CPU that the processes it is given spent while it measured.
//!
//! ```text
//! rls_load --target http://127.0.0.1:8089 --domain bench_local
//!          (--rate 4000 | --in-flight 32) [--seconds 5] [--warmup 1] [--connections 4]
//!          [--key remote_address] [--values 1000] [--timeout-ms 1000] [--pid proxy=PID]...
//! ```
//!
//! Every call is `domain` with one descriptor `(key, 10.x.y.z)`, the value going round `values`
//! addresses. **Open loop**: call `i` is due at `start + i / rate`; a timerfd paces the calls
//! (tokio's timer is millisecond-grained, a timerfd fires within microseconds), and a call's
//! latency runs from its due time, not from when it went out, so a client or a server that falls
//! behind shows as latency instead of hiding it (no coordinated omission). `lag` is how late the
//! calls went out: the client's own floor under every latency; `sent_p50`/`sent_p99` are the
//! latencies from the moment each call went out, without it. **Closed loop**: `in-flight`
//! calls at all times, each answered one replaced at once, for `seconds`. Both are bounded: the
//! open loop sends `rate x seconds` calls, the closed loop stops starting calls after `seconds`,
//! and every call gives up after `timeout-ms` (counted as `errors`).
//!
//! The warm-up (same load, not measured) comes first; then `utime + stime` of every `--pid` is
//! read from `/proc/PID/stat` before and after the measured phase, and of this client itself,
//! which is reported apart (`client_cpu_us`) so that a reader can leave it out. One line goes to
//! stdout: `RESULT key=value ...`, latencies in microseconds, CPU in microseconds per decision.

use std::io;
use std::os::fd::OwnedFd;
use std::time::Duration;

use rustix::time::{
    ClockId, Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags, Timespec, clock_gettime,
    timerfd_create, timerfd_settime,
};
use spillway_rls::pb::{self, Code, RateLimitServiceClient};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::task::JoinSet;
use tonic::transport::{Channel, Endpoint};

struct Args {
    target: String,
    domain: String,
    key: String,
    values: usize,
    load: Load,
    seconds: f64,
    warmup: f64,
    connections: usize,
    timeout: Duration,
    pids: Vec<(String, u32)>,
}

#[derive(Clone, Copy)]
enum Load {
    /// Calls a second, each due on a clock.
    Open { rate: f64 },
    /// Calls kept in flight.
    Closed { in_flight: usize },
}

const USAGE: &str = "usage: rls_load --target URL --domain D (--rate R | --in-flight N) \
[--seconds S] [--warmup S] [--connections C] [--key K] [--values N] [--timeout-ms MS] \
[--pid NAME=PID]...";

fn usage(message: &str) -> ! {
    eprintln!("rls_load: {message}\n{USAGE}");
    std::process::exit(2);
}

fn parse_args() -> Args {
    let mut args = Args {
        target: String::new(),
        domain: String::new(),
        key: "remote_address".into(),
        values: 1000,
        load: Load::Closed { in_flight: 0 },
        seconds: 5.0,
        warmup: 1.0,
        connections: 4,
        timeout: Duration::from_secs(1),
        pids: Vec::new(),
    };
    let mut given = std::env::args().skip(1);
    while let Some(flag) = given.next() {
        let value = given
            .next()
            .unwrap_or_else(|| usage(&format!("{flag} needs a value")));
        let number = |what: &str| -> f64 {
            value
                .parse::<f64>()
                .ok()
                .filter(|n| n.is_finite() && *n >= 0.0)
                .unwrap_or_else(|| usage(&format!("{flag} {value}: {what}")))
        };
        match flag.as_str() {
            "--target" => args.target = value,
            "--domain" => args.domain = value,
            "--key" => args.key = value,
            "--values" => args.values = number("a count").max(1.0) as usize,
            "--rate" => {
                args.load = Load::Open {
                    rate: number("calls a second"),
                }
            }
            "--in-flight" => {
                args.load = Load::Closed {
                    in_flight: number("a count") as usize,
                }
            }
            "--seconds" => args.seconds = number("seconds"),
            "--warmup" => args.warmup = number("seconds"),
            "--connections" => args.connections = number("a count").max(1.0) as usize,
            "--timeout-ms" => args.timeout = Duration::from_millis(number("milliseconds") as u64),
            "--pid" => {
                let (name, pid) = value
                    .split_once('=')
                    .and_then(|(name, pid)| Some((name.to_owned(), pid.parse().ok()?)))
                    .unwrap_or_else(|| usage(&format!("--pid {value}: NAME=PID")));
                args.pids.push((name, pid));
            }
            _ => usage(&format!("unknown flag {flag}")),
        }
    }
    if args.target.is_empty() || args.domain.is_empty() {
        usage("--target and --domain are needed");
    }
    match args.load {
        Load::Open { rate } if rate < 1.0 => usage("--rate must be at least 1"),
        Load::Closed { in_flight: 0 } => usage("give --rate or --in-flight"),
        _ => {}
    }
    args
}

/// CLOCK_MONOTONIC in nanoseconds: the timerfd's clock, so due times and answers compare.
fn now_ns() -> u64 {
    let t = clock_gettime(ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

fn timespec(ns: u64) -> Timespec {
    Timespec {
        tv_sec: (ns / 1_000_000_000) as i64,
        tv_nsec: (ns % 1_000_000_000) as i64,
    }
}

/// A timer that fires every `interval_ns` from `first_ns` (absolute, CLOCK_MONOTONIC).
fn periodic_timer(first_ns: u64, interval_ns: u64) -> io::Result<AsyncFd<OwnedFd>> {
    let fd = timerfd_create(
        TimerfdClockId::Monotonic,
        TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
    )?;
    let spec = Itimerspec {
        it_interval: timespec(interval_ns),
        it_value: timespec(first_ns),
    };
    timerfd_settime(&fd, TimerfdTimerFlags::ABSTIME, &spec)?;
    // SAFETY: the `AsyncFd` owns the `OwnedFd`, which stays open and the same descriptor until
    // both are dropped together, as `register` asks.
    unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }.map_err(io::Error::from)
}

/// How many times the timer fired since the last read.
async fn ticks(timer: &AsyncFd<OwnedFd>) -> io::Result<u64> {
    loop {
        let mut ready = timer.readable().await?;
        let mut buf = [0u8; 8];
        match ready.try_io(|fd| rustix::io::read(fd.get_ref(), &mut buf).map_err(io::Error::from)) {
            Ok(Ok(_)) => return Ok(u64::from_ne_bytes(buf)),
            Ok(Err(err)) => return Err(err),
            Err(_would_block) => continue,
        }
    }
}

/// `utime + stime` of a process in microseconds, from `/proc/PID/stat` (all its threads).
fn cpu_us(pid: &str, tick_us: u64) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    // The command name is in parentheses and may hold spaces: count fields after the last ')'.
    // Field 14 is utime and 15 stime; the text after ')' starts at field 3.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (ticks(11) + ticks(12)) * tick_us
}

/// One clock tick of `/proc/PID/stat` in microseconds (`getconf CLK_TCK`, 100 on Linux).
fn tick_us() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .and_then(|hz| hz.trim().parse::<u64>().ok())
        .filter(|&hz| hz > 0)
        .map_or(10_000, |hz| 1_000_000 / hz)
}

enum Outcome {
    Ok,
    OverLimit,
    Error,
}

/// One call's due time (open loop) or start (closed loop), its answer's time, and the answer.
struct Done {
    due_ns: u64,
    sent_ns: u64,
    answered_ns: u64,
    outcome: Outcome,
}

#[derive(Default)]
struct Tally {
    /// From the due time (open loop) or the start (closed loop) to the answer.
    latencies_ns: Vec<u64>,
    /// From the moment the call went out to the answer: the latency without the client's lag.
    service_ns: Vec<u64>,
    lags_ns: Vec<u64>,
    ok: u64,
    over_limit: u64,
    errors: u64,
    last_answer_ns: u64,
}

impl Tally {
    fn add(&mut self, done: Done) {
        self.last_answer_ns = self.last_answer_ns.max(done.answered_ns);
        match done.outcome {
            Outcome::Ok => self.ok += 1,
            Outcome::OverLimit => self.over_limit += 1,
            Outcome::Error => {
                self.errors += 1;
                return;
            }
        }
        self.latencies_ns
            .push(done.answered_ns.saturating_sub(done.due_ns));
        self.service_ns
            .push(done.answered_ns.saturating_sub(done.sent_ns));
        self.lags_ns.push(done.sent_ns.saturating_sub(done.due_ns));
    }

    fn decisions(&self) -> u64 {
        self.ok + self.over_limit
    }
}

/// What every call shares: the connections and the requests, one per descriptor value.
struct Calls {
    clients: Vec<RateLimitServiceClient<Channel>>,
    requests: Vec<pb::RateLimitRequest>,
    timeout: Duration,
}

impl Calls {
    /// Starts call `i` (due at `due_ns`) on connection `i % connections`.
    fn start(&self, set: &mut JoinSet<Done>, i: u64, due_ns: u64) {
        let mut client = self.clients[i as usize % self.clients.len()].clone();
        let request = self.requests[i as usize % self.requests.len()].clone();
        let timeout = self.timeout;
        set.spawn(async move {
            let sent_ns = now_ns();
            let answer = tokio::time::timeout(timeout, client.should_rate_limit(request)).await;
            let outcome = match answer {
                Ok(Ok(answer)) => match Code::try_from(answer.into_inner().overall_code) {
                    Ok(Code::Ok) => Outcome::Ok,
                    Ok(Code::OverLimit) => Outcome::OverLimit,
                    _ => Outcome::Error,
                },
                _ => Outcome::Error,
            };
            Done {
                due_ns,
                sent_ns,
                answered_ns: now_ns(),
                outcome,
            }
        });
    }
}

/// Open loop: `count` calls, call `i` due at `start + i x interval`.
async fn open(calls: &Calls, rate: f64, seconds: f64) -> io::Result<(Tally, f64)> {
    let interval_ns = (1e9 / rate).round().max(1.0) as u64;
    let count = (rate * seconds).round() as u64;
    let first_ns = now_ns() + 1_000_000;
    let timer = periodic_timer(first_ns, interval_ns)?;
    let mut set = JoinSet::new();
    let mut tally = Tally::default();
    let mut next = 0u64;
    while next < count {
        tokio::select! {
            biased;
            fired = ticks(&timer) => {
                let due_now = (next + fired?).min(count);
                while next < due_now {
                    calls.start(&mut set, next, first_ns + next * interval_ns);
                    next += 1;
                }
            }
            Some(done) = set.join_next() => tally.add(done.expect("call task")),
        }
    }
    drop(timer);
    while let Some(done) = set.join_next().await {
        tally.add(done.expect("call task"));
    }
    // The achieved rate is over the schedule's span, from the first due time to the last answer
    // or the last due time, whichever is later: a server that falls behind stretches it.
    let end = tally.last_answer_ns.max(first_ns + count * interval_ns);
    Ok((tally, (end - first_ns) as f64 / 1e9))
}

/// Closed loop: `in_flight` calls at all times until `seconds` have passed.
async fn closed(calls: &Calls, in_flight: usize, seconds: f64) -> (Tally, f64) {
    let start = now_ns();
    let end = start + (seconds * 1e9) as u64;
    let mut set = JoinSet::new();
    let mut tally = Tally::default();
    let mut next = 0u64;
    for _ in 0..in_flight {
        calls.start(&mut set, next, now_ns());
        next += 1;
    }
    while let Some(done) = set.join_next().await {
        let done = done.expect("call task");
        let answered = done.answered_ns;
        tally.add(done);
        if answered < end {
            calls.start(&mut set, next, now_ns());
            next += 1;
        }
    }
    let span = (tally.last_answer_ns.max(start + 1) - start) as f64 / 1e9;
    (tally, span)
}

fn percentile_us(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1] as f64 / 1e3
}

async fn run(args: Args) -> io::Result<String> {
    let mut clients = Vec::new();
    for _ in 0..args.connections {
        // One Channel is one HTTP/2 connection; calls are dealt to them in turn.
        let channel = Endpoint::from_shared(args.target.clone())
            .map_err(io::Error::other)?
            .tcp_nodelay(true)
            .connect()
            .await
            .map_err(io::Error::other)?;
        clients.push(RateLimitServiceClient::new(channel));
    }
    let requests = (0..args.values)
        .map(|i| {
            let address = format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255);
            pb::request(&args.domain, &[&[(args.key.as_str(), address.as_str())]])
        })
        .collect();
    let calls = Calls {
        clients,
        requests,
        timeout: args.timeout,
    };
    let phase = |seconds: f64| {
        let calls = &calls;
        async move {
            match args.load {
                Load::Open { rate } => open(calls, rate, seconds).await,
                Load::Closed { in_flight } => Ok(closed(calls, in_flight, seconds).await),
            }
        }
    };
    if args.warmup > 0.0 {
        phase(args.warmup).await?;
    }
    let tick = tick_us();
    let own = std::process::id().to_string();
    let before: Vec<u64> = args
        .pids
        .iter()
        .map(|(_, pid)| cpu_us(&pid.to_string(), tick))
        .collect();
    let own_before = cpu_us(&own, tick);
    let (mut tally, span) = phase(args.seconds).await?;
    let own_cpu = cpu_us(&own, tick) - own_before;
    let spent: Vec<u64> = args
        .pids
        .iter()
        .zip(&before)
        .map(|((_, pid), before)| cpu_us(&pid.to_string(), tick).saturating_sub(*before))
        .collect();

    tally.latencies_ns.sort_unstable();
    tally.service_ns.sort_unstable();
    tally.lags_ns.sort_unstable();
    let decisions = tally.decisions().max(1) as f64;
    let mut line = format!(
        "RESULT mode={} decisions={} ok={} over_limit={} errors={} seconds={:.3} rate={:.1} \
         p50_us={:.1} p99_us={:.1} p999_us={:.1} max_us={:.1} sent_p50_us={:.1} sent_p99_us={:.1} \
         lag_p50_us={:.1} lag_p99_us={:.1} client_cpu_us={:.2}",
        match args.load {
            Load::Open { .. } => "open",
            Load::Closed { .. } => "closed",
        },
        tally.decisions(),
        tally.ok,
        tally.over_limit,
        tally.errors,
        span,
        tally.decisions() as f64 / span,
        percentile_us(&tally.latencies_ns, 50.0),
        percentile_us(&tally.latencies_ns, 99.0),
        percentile_us(&tally.latencies_ns, 99.9),
        percentile_us(&tally.latencies_ns, 100.0),
        percentile_us(&tally.service_ns, 50.0),
        percentile_us(&tally.service_ns, 99.0),
        percentile_us(&tally.lags_ns, 50.0),
        percentile_us(&tally.lags_ns, 99.0),
        own_cpu as f64 / decisions,
    );
    for ((name, _), spent) in args.pids.iter().zip(spent) {
        line.push_str(&format!(" cpu_{name}_us={:.2}", spent as f64 / decisions));
    }
    Ok(line)
}

fn main() {
    let args = parse_args();
    // One thread: the client shares the cores with the server it measures.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    match runtime.block_on(run(args)) {
        Ok(line) => println!("{line}"),
        Err(err) => {
            eprintln!("rls_load: {err}");
            std::process::exit(1);
        }
    }
}
