#!/usr/bin/env python3
"""The concurrency benchmark's report (Markdown) and chart (SVG), from run.sh's rows.

report.py ROWS REPORT.md CHART.svg WORKERS SERVICE_MS RATE CAPACITY TIMEOUT_MS SECONDS WARMUP
          ROUNDS CORES LOAD_BEFORE LOAD_AFTER
Each row of ROWS: NAME ROUND GOODPUT P50_MS P99_MS OK REFUSED TIMEOUTS ERRORS.
"""
import statistics
import sys

(rows_path, out_path, chart_path, workers, service_ms, rate, capacity, timeout_ms, seconds,
 warmup, rounds, cores, load_before, load_after) = sys.argv[1:15]
capacity = float(capacity)
timeout_ms = float(timeout_ms)

runs = {}
order = []
for line in open(rows_path):
    parts = line.split()
    if len(parts) < 9:
        continue
    name = parts[0]
    goodput, p50, p99 = map(float, parts[2:5])
    ok, refused, timeouts, errors = map(int, parts[5:9])
    if name not in runs:
        runs[name] = []
        order.append(name)
    runs[name].append(dict(goodput=goodput, p50=p50, p99=p99, ok=ok, refused=refused,
                           timeouts=timeouts, errors=errors))


def med(name, key):
    return statistics.median(r[key] for r in runs[name])


def span(name, key, fmt):
    values = [r[key] for r in runs[name]]
    lo, hi = min(values), max(values)
    text = fmt.format(lo) if lo == hi else (fmt.format(lo) + "–" + fmt.format(hi))
    if key == "p99" and hi >= timeout_ms:
        text = "≥ " + text
    return text


fixed = [n for n in order if n.startswith("fixed-")]
# The best fixed limit: the highest median goodput; among those within 1% of it, the lowest p99.
top = max(med(n, "goodput") for n in fixed)
best = min((n for n in fixed if med(n, "goodput") >= 0.99 * top), key=lambda n: med(n, "p99"))
unloaded_p99 = med("unloaded", "p99")

lines = []
lines.append(f"Upstream: {workers} workers of {service_ms} ms (capacity {capacity:.0f}/s), offered "
             f"{rate}/s open-loop (the unloaded row: {capacity / 4:.0f}/s); client deadline "
             f"{timeout_ms:.0f} ms; {seconds} s a row, the first {warmup} s not counted; "
             f"{rounds} rounds, ranges over rounds. Machine: {cores} cores, load average "
             f"{load_before} before and {load_after} after.")
lines.append("")
lines.append("| row | goodput (/s) | of capacity | p50 (ms) | p99 admitted (ms) | refused 503 | timed out | errors |")
lines.append("| --- | --- | --- | --- | --- | --- | --- | --- |")
for name in order:
    mark = " (best fixed)" if name == best else ""
    share = med(name, "goodput") / capacity
    lines.append(
        f"| {name}{mark} | {span(name, 'goodput', '{:.0f}')} | {share:.0%} | "
        f"{span(name, 'p50', '{:.1f}')} | {span(name, 'p99', '{:.1f}')} | "
        f"{span(name, 'refused', '{}')} | {span(name, 'timeouts', '{}')} | {span(name, 'errors', '{}')} |")
lines.append("")
g_good, g_p99 = med("gradient", "goodput"), med("gradient", "p99")
b_good = med(best, "goodput")
ratio = g_good / b_good if b_good else 0.0
p99_ratio = g_p99 / unloaded_p99 if unloaded_p99 else float("inf")
met_goodput = ratio >= 0.9
met_p99 = p99_ratio <= 2.0
lines.append(f"Goal: gradient's goodput {g_good:.0f}/s is {ratio:.1%} of the best fixed limit's "
             f"({best}: {b_good:.0f}/s), goal at least 90%: {'met' if met_goodput else 'NOT met'}; "
             f"its p99 {g_p99:.1f} ms is {p99_ratio:.2f}x the unloaded p99 ({unloaded_p99:.1f} ms), "
             f"goal at most 2x: {'met' if met_p99 else 'NOT met'} (medians over rounds).")
open(out_path, "w").write("\n".join(lines) + "\n")

# The chart: goodput and p99 per row, as two panels of horizontal bars.
bar_h, gap, left, panel_w, top_margin = 18, 6, 130, 330, 40
height = top_margin + len(order) * (bar_h + gap) + 40
width = left + 2 * panel_w + 60
max_p99 = max(max(r["p99"] for r in runs[n]) for n in order)
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
       f'font-family="sans-serif" font-size="12">',
       f'<rect width="{width}" height="{height}" fill="white"/>',
       f'<text x="{left}" y="18" font-weight="bold">goodput (/s), capacity {capacity:.0f}/s</text>',
       f'<text x="{left + panel_w + 40}" y="18" font-weight="bold">p99 of admitted requests (ms, log scale)</text>']
import math


def log_x(v):
    lo, hi = math.log10(1.0), math.log10(max(max_p99, 10.0) * 1.2)
    return panel_w * (math.log10(max(v, 1.0)) - lo) / (hi - lo)


for i, name in enumerate(order):
    y = top_margin + i * (bar_h + gap)
    color = "#d62728" if name == "none" else "#2ca02c" if name == "gradient" else \
        "#9467bd" if name == "vegas" else "#7f7f7f" if name == "unloaded" else "#1f77b4"
    svg.append(f'<text x="{left - 6}" y="{y + 13}" text-anchor="end">{name}</text>')
    lo = min(r["goodput"] for r in runs[name]); hi = max(r["goodput"] for r in runs[name])
    w = panel_w * med(name, "goodput") / (capacity * 1.1)
    svg.append(f'<rect x="{left}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="{color}"/>')
    svg.append(f'<line x1="{left + panel_w * lo / (capacity * 1.1):.1f}" x2="{left + panel_w * hi / (capacity * 1.1):.1f}" '
               f'y1="{y + bar_h / 2}" y2="{y + bar_h / 2}" stroke="black"/>')
    svg.append(f'<text x="{left + w + 4:.1f}" y="{y + 13}">{med(name, "goodput"):.0f}</text>')
    x0 = left + panel_w + 40
    w = log_x(med(name, "p99"))
    svg.append(f'<rect x="{x0}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="{color}"/>')
    svg.append(f'<text x="{x0 + w + 4:.1f}" y="{y + 13}">{med(name, "p99"):.0f}</text>')
cap_x = left + panel_w / 1.1
base = top_margin + len(order) * (bar_h + gap)
svg.append(f'<line x1="{cap_x:.1f}" x2="{cap_x:.1f}" y1="{top_margin - 4}" y2="{base}" stroke="black" stroke-dasharray="4 3"/>')
x0 = left + panel_w + 40
two = x0 + log_x(2 * unloaded_p99)
svg.append(f'<line x1="{two:.1f}" x2="{two:.1f}" y1="{top_margin - 4}" y2="{base}" stroke="black" stroke-dasharray="4 3"/>')
svg.append(f'<text x="{two + 3:.1f}" y="{base + 14}">2x unloaded p99</text>')
svg.append(f'<text x="{cap_x - 40:.1f}" y="{base + 14}">capacity</text>')
svg.append(f'<text x="{left}" y="{height - 6}" fill="#555">bars: median over rounds; whiskers: range. '
           f'{workers} workers x {service_ms} ms, offered {rate}/s.</text>')
svg.append('</svg>')
open(chart_path, "w").write("\n".join(svg) + "\n")
