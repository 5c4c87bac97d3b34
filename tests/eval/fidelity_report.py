"""Summaries of fidelity.py's results: a markdown table of medians and an SVG plot.

`summary_markdown(records)`: per workload, policy and budget, the median over prompts of the
bytes stored (fraction of FP16), top-1 agreement with its min..max, the perplexity ratio with
its max, and the mean over layers of the attention-output error.
`write_svg(records, path)`: one panel per workload, median top-1 agreement against the median
bytes fraction, one line per policy. Usable alone, merging runs:
`fidelity_report.py results.json... [--svg P]`.
"""

import argparse
import json
import sys
from collections import defaultdict

import numpy as np

COLORS = ["#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d",
          "#666666", "#1f78b4", "#b2df8a", "#fb9a99"]


def groups(records):
    out = defaultdict(list)
    for r in records:
        out[(r["workload"], r["policy"], r["budget"])].append(r)
    return out


def summary_rows(records):
    rows = []
    for (workload, policy, budget), rs in groups(records).items():
        agree = np.array([r["agreement"] for r in rs])
        ppl = np.array([r["ppl_ratio"] for r in rs])
        rows.append({
            "workload": workload, "policy": policy, "budget": budget, "prompts": len(rs),
            "bytes": float(np.median([r["bytes_fraction"] for r in rs])),
            "agreement": float(np.median(agree)), "agreement_min": float(agree.min()),
            "agreement_max": float(agree.max()),
            "ppl_ratio": float(np.median(ppl)), "ppl_ratio_max": float(ppl.max()),
            "attention_error": float(np.median([np.mean(r["attention_error"]) for r in rs])),
        })
    return rows


def summary_markdown(records):
    lines = ["| workload | policy | budget | bytes | top-1 (min..max) | ppl ratio (max) | "
             "attn err | prompts |", "|---|---|---|---|---|---|---|---|"]
    for r in summary_rows(records):
        budget = f"{r['budget']:.0%}" if r["budget"] else "-"
        lines.append(
            f"| {r['workload']} | {r['policy']} | {budget} | {r['bytes']:.1%} | "
            f"{r['agreement']:.2%} ({r['agreement_min']:.2%}..{r['agreement_max']:.2%}) | "
            f"x{r['ppl_ratio']:.4f} (x{r['ppl_ratio_max']:.4f}) | {r['attention_error']:.4f} | "
            f"{r['prompts']} |")
    return "\n".join(lines)


def pivot_markdown(records, metric="agreement", budgets=None):
    """One row per policy, one column per (workload, budget): the median of `metric`."""
    rows = summary_rows(records)
    workloads = sorted({r["workload"] for r in rows})
    budgets = budgets or sorted({r["budget"] for r in rows if r["budget"]}, reverse=True)
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    cell = {(r["workload"], r["policy"], r["budget"]): r for r in rows}
    head = [f"{w} {b:.0%}" for w in workloads for b in budgets]
    lines = ["| policy | " + " | ".join(head) + " |", "|---" * (len(head) + 1) + "|"]
    for policy in policies:
        values = []
        for w in workloads:
            for b in budgets:
                r = cell.get((w, policy, b)) or cell.get((w, policy, None))
                if r is None or (r["budget"] is None and b != budgets[0]):
                    values.append("")
                elif metric == "agreement":
                    values.append(f"{r['agreement']:.2%}")
                else:
                    values.append(f"x{r[metric]:.4f}" if metric == "ppl_ratio" else
                                  f"{r[metric]:.4f}")
        lines.append(f"| {policy} | " + " | ".join(values) + " |")
    return "\n".join(lines)


def targets_markdown(records, budget=0.37, ours="ours"):
    """Issue 11's targets at `budget`, per workload: met or missed, with the figures."""
    rows = {(r["workload"], r["policy"], r["budget"]): r for r in summary_rows(records)}
    lines = ["| workload | target | figure | met |", "|---|---|---|---|"]
    for w in sorted({r["workload"] for r in rows.values()}):
        o = rows.get((w, ours, budget))
        if o is None:
            continue
        checks = [(f"{ours} top-1 >= 99% at {budget:.0%}", f"{o['agreement']:.2%}",
                   o["agreement"] >= 0.99),
                  (f"{ours} perplexity within +2%", f"x{o['ppl_ratio']:.4f}",
                   o["ppl_ratio"] <= 1.02)]
        for rival in ("h2o", "snapkv"):
            r = rows.get((w, rival, budget))
            if r:
                checks.append((f"{ours} above {rival}", f"{o['agreement']:.2%} vs "
                               f"{r['agreement']:.2%}", o["agreement"] > r["agreement"]))
        i8 = rows.get((w, "int8", None))
        if i8:
            checks.append(("int8 top-1 >= 99.5%", f"{i8['agreement']:.2%} at "
                           f"{i8['bytes']:.1%} bytes", i8["agreement"] >= 0.995))
        lines += [f"| {w} | {t} | {f} | {'yes' if ok else '**no**'} |" for t, f, ok in checks]
    return "\n".join(lines)


def write_svg(records, path):
    rows = summary_rows(records)
    workloads = sorted({r["workload"] for r in rows})
    policies = sorted({r["policy"] for r in rows})
    lowest = min(r["agreement"] for r in rows)
    y_min = max(0.0, np.floor(lowest * 20) / 20)
    w, h, pad = 360, 300, 50
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w * len(workloads) + 170}" '
             f'height="{h + 40}" font-family="sans-serif" font-size="11">']

    def x_of(frac, panel):
        return panel * w + pad + frac * (w - pad - 20)

    def y_of(agree):
        return 20 + (1 - (agree - y_min) / (1 - y_min)) * (h - pad - 20)

    for panel, workload in enumerate(workloads):
        x0, y0 = x_of(0, panel), y_of(y_min)
        parts.append(f'<text x="{x0 + 100}" y="14" font-weight="bold">{workload}</text>')
        parts.append(f'<line x1="{x0}" y1="{y0}" x2="{x_of(1.05, panel)}" y2="{y0}" '
                     'stroke="black"/>')
        parts.append(f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y_of(1)}" stroke="black"/>')
        for tick in np.linspace(0, 1, 5):
            parts.append(f'<text x="{x_of(tick, panel) - 8}" y="{y0 + 14}">{tick:.0%}</text>')
        for tick in np.linspace(y_min, 1, 5):
            parts.append(f'<text x="{x0 - 40}" y="{y_of(tick) + 4}">{tick:.1%}</text>')
            parts.append(f'<line x1="{x0}" y1="{y_of(tick)}" x2="{x_of(1.05, panel)}" '
                         f'y2="{y_of(tick)}" stroke="#eee"/>')
        parts.append(f'<text x="{x0 + 60}" y="{y0 + 30}">KV bytes (fraction of FP16)</text>')
        for i, policy in enumerate(policies):
            pts = sorted((r["bytes"], r["agreement"]) for r in rows
                         if r["workload"] == workload and r["policy"] == policy)
            color = COLORS[i % len(COLORS)]
            if len(pts) > 1:
                path_d = " ".join(f"{x_of(b, panel):.1f},{y_of(a):.1f}" for b, a in pts)
                parts.append(f'<polyline points="{path_d}" fill="none" stroke="{color}"/>')
            for b, a in pts:
                parts.append(f'<circle cx="{x_of(b, panel):.1f}" cy="{y_of(a):.1f}" r="3" '
                             f'fill="{color}"/>')
    for i, policy in enumerate(policies):
        y = 30 + i * 16
        x = w * len(workloads) + 10
        parts.append(f'<rect x="{x}" y="{y - 9}" width="10" height="10" '
                     f'fill="{COLORS[i % len(COLORS)]}"/><text x="{x + 14}" y="{y}">{policy}</text>')
    parts.append(f'<text x="{w * len(workloads) + 10}" y="{h}">median top-1 agreement</text>')
    parts.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(parts) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("results", nargs="+", help="fidelity.py JSON files, merged")
    parser.add_argument("--svg")
    args = parser.parse_args()
    records = []
    for path in args.results:
        with open(path) as f:
            records += json.load(f)["records"]
    print(summary_markdown(records))
    print()
    print(pivot_markdown(records))
    print()
    print(targets_markdown(records))
    if args.svg:
        write_svg(records, args.svg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
