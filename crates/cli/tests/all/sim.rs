//! `spillway sim` as a process: the table it prints, with and without the surge guard.

use std::process::Command;

const SPILLWAY: &str = env!("CARGO_BIN_EXE_spillway");

/// The wrongful drops of drop-ratio in `host-burst`, from the printed table.
fn host_burst_wrongful_drops(extra: &[&str]) -> u64 {
    let output = Command::new(SPILLWAY)
        .args([
            "sim",
            "--scenario",
            "host-burst",
            "--algorithm",
            "drop-ratio",
        ])
        .args(["--duration", "35", "--seed", "3"])
        .args(extra)
        .output()
        .expect("spillway sim runs");
    let table = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{table}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let row = table
        .lines()
        .find(|l| l.starts_with("| drop-ratio |"))
        .unwrap_or_else(|| panic!("a drop-ratio row:\n{table}"));
    // | algorithm | delay | error | overshoot | Jain | wrongful drops | ...
    row.split('|').nth(6).unwrap().trim().parse().unwrap()
}

#[test]
fn a_lone_hosts_burst_is_dropped_only_until_its_surge_report_is_answered() {
    // Host 0 adds 50 times its load while the fleet is at 60% of the limit: its guard holds it
    // to its part until the controller answers its surge report (a few hundred drops at most,
    // where it was held until the interval's report had counted the burst: about 3,000);
    // without the guard nothing drops.
    let guarded = host_burst_wrongful_drops(&[]);
    let unguarded = host_burst_wrongful_drops(&["--no-surge-guard"]);
    assert!(
        (1..300).contains(&guarded),
        "{guarded} wrongful drops with the guard"
    );
    assert_eq!(unguarded, 0);
}

#[test]
fn the_tokens_scenario_runs_drop_ratio_and_prints_what_its_budget_admitted() {
    let output = Command::new(SPILLWAY)
        .args(["sim", "--scenario", "tokens", "--seed", "2"])
        .output()
        .expect("spillway sim runs");
    let table = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{table}");
    // A token budget is a drop-ratio bucket: the other algorithms are left out by default.
    assert!(table.contains("| drop-ratio |"), "{table}");
    assert!(!table.contains("| central-counter |"), "{table}");
    let line = table
        .lines()
        .find(|l| l.starts_with("drop-ratio's token budget: "))
        .unwrap_or_else(|| panic!("the budget's line:\n{table}"));
    let admitted: f64 = line["drop-ratio's token budget: ".len()..]
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    // Within the 50 s window's noise band of answers of spread sizes (±15.5%).
    assert!((0.85..=1.15).contains(&admitted), "{line}");

    let refused = Command::new(SPILLWAY)
        .args([
            "sim",
            "--scenario",
            "tokens",
            "--algorithm",
            "central-counter",
        ])
        .output()
        .expect("spillway sim runs");
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("drop-ratio"));
}
