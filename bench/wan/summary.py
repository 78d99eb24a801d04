#!/usr/bin/env python3
"""The ranges (min-max over runs) of bench/wan/wan.py's JSON lines, as Markdown tables."""
import json
import sys
from collections import defaultdict


def span(values):
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return f"{lo:g}" if lo == hi else f"{lo:g}-{hi:g}"


def main(path):
    runs = defaultdict(list)
    with open(path) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                runs[(r["scenario"], r["delay_ms"])].append(r)
    print("| scenario | one-way delay | runs | admitted / limit | slowest second | busiest second |")
    print("| --- | --- | --- | --- | --- | --- |")
    for (scenario, delay), rs in sorted(runs.items()):
        if scenario == "partition":
            continue
        name = "1% loss" if scenario == "loss" else "steady"
        print(f"| {name} | {delay:g} ms | {len(rs)} | {span([r['admitted_x'] for r in rs])} "
              f"| {span([r['min_second_x'] for r in rs])} | {span([r['max_second_x'] for r in rs])} |")
    print()
    print("| one-way delay | runs | before / limit | cut-off region (/s) | the other two (/s) "
          "| partition / limit | re-converged after (s) | after / limit | busiest second |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for (scenario, delay), rs in sorted(runs.items()):
        if scenario != "partition":
            continue
        print(f"| {delay:g} ms | {len(rs)} | {span([r['before_x'] for r in rs])} "
              f"| {span([r['partition_alone_rps'] for r in rs])} "
              f"| {span([r['partition_rest_rps'] for r in rs])} "
              f"| {span([r['partition_total_x'] for r in rs])} "
              f"| {span([r['reconverge_s'] for r in rs])} | {span([r['after_x'] for r in rs])} "
              f"| {span([r['max_second_x'] for r in rs])} |")


if __name__ == "__main__":
    main(sys.argv[1])
