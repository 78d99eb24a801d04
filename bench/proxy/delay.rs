//! A TCP relay that holds every byte for a fixed time in each direction: the network link of the
//! proxy benchmark's "Redis across a network" rows, for kernels without `sch_netem`.
//!
//! `delay LISTEN TARGET ONE_WAY_MICROS` accepts on LISTEN and relays each connection to TARGET.
//! Each direction is a reader thread that stamps every chunk it reads with `now + delay` and a
//! writer thread that sends the chunks in order, each no earlier than its stamp. A chunk is held
//! for the delay, not queued behind the previous one's delay, so pipelined requests (the proxy's
//! one multiplexed Redis connection) overlap as they would on a wire: a 0.25 ms link costs 0.5 ms
//! per round trip whatever the rate. Built by `run.sh` with `rustc -O`, std only.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

extern "C" {
    fn prctl(option: i32, ...) -> i32;
}
const PR_SET_TIMERSLACK: i32 = 29;

/// Sleeps of a quarter millisecond must end on time: the default timer slack of a thread is
/// 50 us, a fifth of the delay. Ask for 1 ns (the kernel still rounds to its timer's precision).
fn tight_timers() {
    // SAFETY: prctl(PR_SET_TIMERSLACK, n) takes one unsigned long and touches no memory of ours.
    unsafe {
        prctl(PR_SET_TIMERSLACK, 1 as std::ffi::c_ulong);
    }
}

fn pipe(mut from: TcpStream, mut to: TcpStream, delay: Duration) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let writer = thread::spawn(move || {
        tight_timers();
        // A chunk read while the writer slept, not due yet.
        let mut early: Option<(Instant, Vec<u8>)> = None;
        loop {
            let Some((due, mut out)) = early.take().or_else(|| rx.recv().ok()) else {
                break;
            };
            let now = Instant::now();
            if due > now {
                thread::sleep(due - now);
            }
            // Send what else has come due in one write: one wakeup per burst, not per chunk,
            // so the relay's own CPU (it shares the machine) grows slower than the rate.
            let now = Instant::now();
            while let Ok((due, chunk)) = rx.try_recv() {
                if due > now {
                    early = Some((due, chunk));
                    break;
                }
                out.extend_from_slice(&chunk);
            }
            if to.write_all(&out).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if tx
                    .send((Instant::now() + delay, buf[..n].to_vec()))
                    .is_err()
                {
                    break;
                }
            }
        }
    }
    drop(tx);
    let _ = writer.join();
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 4 {
        eprintln!("usage: delay LISTEN TARGET ONE_WAY_MICROS");
        std::process::exit(2);
    }
    let listener = TcpListener::bind(&args[1]).expect("bind LISTEN");
    let target = args[2].clone();
    let delay = Duration::from_micros(args[3].parse().expect("ONE_WAY_MICROS"));
    tight_timers();
    for client in listener.incoming() {
        let Ok(client) = client else { continue };
        let target = target.clone();
        thread::spawn(move || {
            let Ok(server) = TcpStream::connect(&target) else {
                return;
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (c2, s2) = match (client.try_clone(), server.try_clone()) {
                (Ok(c), Ok(s)) => (c, s),
                _ => return,
            };
            let up = thread::spawn(move || pipe(client, server, delay));
            pipe(s2, c2, delay);
            let _ = up.join();
        });
    }
}
