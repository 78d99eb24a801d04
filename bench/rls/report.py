"""The Markdown report of bench/rls/run.sh: reads its results file (one line per measured phase,
`ROUND CONFIG RESULT key=value ...` as crates/rls/examples/rls_load.rs prints them) and the run's
settings from the environment, and prints medians and ranges over the rounds, and the ratios
to the Redis path phase by phase within each round."""

import os
import statistics
import sys

CONFIGS = ["local", "control", "redis", "redis_link"]
NAMES = {
    "local": "local token bucket (`store: local`)",
    "control": "drop-ratio (`store: control-plane`; standalone, ratio 0)",
    "redis": "fixed window in Redis (`store: redis`), Redis on loopback",
    "redis_link": "fixed window in Redis (`store: redis`), Redis across a link",
}
BASES = {
    "redis": "the Redis path on loopback",
    "redis_link": "the Redis path across the link",
}


def load(path):
    rows = {}
    for line in open(path):
        round_, config, _, *fields = line.split()
        values = {}
        for field in fields:
            key, value = field.split("=", 1)
            values[key] = value if key == "mode" else float(value)
        rows.setdefault((values["mode"], config), {})[int(round_)] = values
    return rows


def cpu(v):
    """CPU per decision counted for the goal: the proxy's and Redis's (not the client's)."""
    return v["cpu_proxy_us"] + v["cpu_redis_us"]


def spread(xs, fmt):
    return f"{fmt(statistics.median(xs))} ({fmt(min(xs))}-{fmt(max(xs))})"


def whole(x):
    return f"{x:,.0f}"


def tenth(x):
    return f"{x:,.1f}"


def two(x):
    return f"{x:.2f}"


def table(rows, mode, rate_title):
    sent = mode == "open"
    print(
        f"| bucket | {rate_title} | p50 | p99 | p99.9 |"
        + (" p99 from the send |" if sent else "")
        + " CPU/decision (proxy + Redis) | proxy | Redis | client (not counted) |"
        " OVER_LIMIT, errors |"
    )
    print("| --- |" + " ---: |" * (10 if sent else 9))
    for c in CONFIGS:
        vs = list(rows[(mode, c)].values())

        def col(key, fmt=whole):
            return spread([v[key] for v in vs], fmt)

        over = sum(v["over_limit"] for v in vs)
        errors = sum(v["errors"] for v in vs)
        print(
            f"| {NAMES[c]} | {col('rate')} | {col('p50_us')} | {col('p99_us')} |"
            f" {col('p999_us')} |"
            + (f" {col('sent_p99_us')} |" if sent else "")
            + f" {spread([cpu(v) for v in vs], tenth)} |"
            f" {col('cpu_proxy_us', tenth)} | {col('cpu_redis_us', tenth)} |"
            f" {col('client_cpu_us', tenth)} | {over:.0f}, {errors:.0f} |"
        )


def against(rows, base):
    """The local and control paths' ratios to the Redis path `base`, round by round."""
    print(f"### Against {BASES[base]}, round by round")
    print()
    print(
        f"Each ratio is to {BASES[base]}'s phase of the same round: p50, p99 and CPU per"
        " decision in the open loop (goals: p99 at most 0.33, CPU at most 0.50), decisions/s at"
        " saturation. The client's lag says how much the machine held the client itself up in"
        " that round's open loops."
    )
    print()
    print(
        "| round | client's lag, p99 (worst phase) | local: p50 / p99 / CPU | decisions/s |"
        " control: p50 / p99 / CPU | decisions/s |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    ratios = {c: {"p50": [], "p99": [], "cpu": [], "sat": []} for c in ("local", "control")}
    for r in sorted(rows[("open", base)]):
        redis_open, redis_sat = rows[("open", base)][r], rows[("closed", base)][r]
        lag = max(rows[("open", c)][r]["lag_p99_us"] for c in ("local", "control", base))
        cells = [f"{lag:,.0f} us"]
        for c in ("local", "control"):
            o, s = rows[("open", c)][r], rows[("closed", c)][r]
            m = o["p50_us"] / redis_open["p50_us"]
            p = o["p99_us"] / redis_open["p99_us"]
            q = cpu(o) / cpu(redis_open)
            t = s["rate"] / redis_sat["rate"]
            for key, x in (("p50", m), ("p99", p), ("cpu", q), ("sat", t)):
                ratios[c][key].append(x)
            cells += [f"{two(m)} / {two(p)} / {two(q)}", f"{t:.2f}x"]
        print(f"| {r} | " + " | ".join(cells) + " |")
    print()
    for c in ("local", "control"):
        m, p, q, t = ratios[c]["p50"], ratios[c]["p99"], ratios[c]["cpu"], ratios[c]["sat"]
        p_met = "met" if statistics.median(p) <= 1 / 3 else "not met"
        q_met = "met" if statistics.median(q) <= 0.5 else "not met"
        print(
            f"- **{c}** against {BASES[base]}: p50 {spread(m, two)};"
            f" p99 {spread(p, two)} (goal 0.33: {p_met} on the"
            f" median, {sum(x <= 1 / 3 for x in p)} of {len(p)} rounds); CPU per decision"
            f" {spread(q, two)} (goal 0.50: {q_met} on the median,"
            f" {sum(x <= 0.5 for x in q)} of {len(q)} rounds); at saturation"
            f" {spread(t, lambda x: f'{x:.2f}x')} its decisions/s."
        )
    print()


def main():
    rows = load(sys.argv[1])
    env = os.environ
    rounds, rate, seconds = env["ROUNDS"], float(env["RATE"]), env["SECONDS_"]
    in_flight, sat_seconds = env["IN_FLIGHT"], env["SAT_SECONDS"]
    print(
        f"Machine: {env['MACHINE']}; load average {env['LOAD_START']} at the start and"
        f" {env['LOAD_END']} at the end; spillway at {env['COMMIT']}."
    )
    print()
    print(
        f"Command: `bench/rls/run.sh {rounds} {env['RATE']} {seconds}` (IN_FLIGHT={in_flight},"
        f" CONNECTIONS={env['CONNECTIONS']}, SAT_SECONDS={sat_seconds}, WARMUP={env['WARMUP']},"
        f" VALUES={env['VALUES']}): {rounds} rounds, each an open loop at {rate:,.0f} calls/s"
        f" for {seconds} s and then a closed loop of {in_flight} calls in flight for"
        f" {sat_seconds} s per bucket, interleaved (local, control, redis, redis_link: the same Redis"
        f" behind a relay holding each byte {env['LINK_DELAY_US']} us each way). Median (lowest-highest)"
        " over the rounds; latencies in microseconds from each call's due time; CPU in"
        " microseconds per decision, the proxy's and redis-server's (`utime + stime`); the load"
        " client's own is listed apart and not counted."
    )
    print()
    print(f"### Open loop, {rate:,.0f} calls/s")
    print()
    table(rows, "open", "calls/s")
    print()
    lags = "; ".join(
        f"{c} {spread([v['lag_p50_us'] for v in rows[('open', c)].values()], tenth)}"
        f" / {spread([v['lag_p99_us'] for v in rows[('open', c)].values()], tenth)}"
        for c in CONFIGS
    )
    print(f"How late the client sent the calls against their due times, p50 / p99 (us): {lags}.")
    print()
    print(f"### Saturation, {in_flight} calls in flight")
    print()
    table(rows, "closed", "decisions/s")
    print()
    for base in BASES:
        against(rows, base)
    calls, _, per_call = env["EVALSHA"].partition(" ")
    measured = sum(
        v["decisions"] for m in ("open", "closed") for b in BASES for v in rows[(m, b)].values()
    )
    print()
    print(
        f"Redis ran {int(calls or 0):,} `EVALSHA` calls ({per_call or '?'} us each inside Redis,"
        f" `INFO commandstats`) for the redis phases' {measured:,.0f} measured decisions and"
        f" their warm-ups, and holds {env['KEYS']} keys."
    )


main()
