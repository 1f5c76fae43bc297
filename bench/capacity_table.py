"""The capacity table and plot of docs/results.md, from a committed `vllm bench sweep` folder that
`agent capacity --export` wrote: the same table `agent capacity` prints, and an SVG of p99 end-to-end
latency against output tokens/s, config by config, each rung labelled by its load and each knee ringed.

    .venv/bin/python bench/capacity_table.py docs/data/capacity/20261207 [--svg docs/data/capacity/20261207.svg]
        [--price-per-hour P] [--target-rate R] [--slo-e2e-p99-ms MS]
"""

from __future__ import annotations

import argparse
import html
from pathlib import Path

from agent import capacity, sweep
from agent.capacity import Curve, Worth
from agent.capacity_run import Ask, table

W, H, PAD = 720, 420, 60
COLORS = ["#555555", "#2a9d8f", "#e76f51", "#264653", "#e9c46a"]


def svg(curves: list[Curve], worths: list[Worth], title: str) -> str:
    points = [(r.median.output_tps, r.p99("latency_ms") or 0.0) for c in curves for r in c.rungs]
    x_max = max(p[0] for p in points) * 1.1
    y_max = max(p[1] for p in points) * 1.15

    def at(x: float, y: float) -> tuple[float, float]:
        return PAD + x / x_max * (W - 2 * PAD), H - PAD - y / y_max * (H - 2 * PAD)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" '
             f'font-size="12"><rect width="{W}" height="{H}" fill="white"/>',
             f'<text x="{W / 2}" y="20" text-anchor="middle" font-size="14">{html.escape(title)}</text>',
             f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - PAD}" y2="{H - PAD}" stroke="black"/>',
             f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{H - PAD}" stroke="black"/>',
             f'<text x="{W / 2}" y="{H - 15}" text-anchor="middle">output tokens/s (median repeat)</text>',
             f'<text x="15" y="{H / 2}" text-anchor="middle" transform="rotate(-90 15 {H / 2})">'
             f'p99 end-to-end latency (ms)</text>']
    for i in range(6):
        x, y = x_max * i / 5, y_max * i / 5
        px, _ = at(x, 0)
        _, py = at(0, y)
        parts.append(f'<text x="{px}" y="{H - PAD + 15}" text-anchor="middle">{x:.0f}</text>')
        parts.append(f'<text x="{PAD - 5}" y="{py + 4}" text-anchor="end">{y:.0f}</text>')
    for n, (curve, worth) in enumerate(zip(curves, worths, strict=True)):
        color = COLORS[n % len(COLORS)]
        xy = [(at(r.median.output_tps, r.p99("latency_ms") or 0.0), r) for r in curve.rungs]
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="'
                     + " ".join(f"{x:.1f},{y:.1f}" for (x, y), _ in xy) + '"/>')
        for (x, y), rung in xy:
            parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{color}"/>'
                         f'<text x="{x + 6:.1f}" y="{y - 6:.1f}" fill="{color}">{rung.load:g}</text>')
            if worth.knee is not None and rung.load == worth.knee.load:
                parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="9" fill="none" stroke="crimson" stroke-width="2"/>')
        parts.append(f'<text x="{W - PAD - 160}" y="{PAD + 16 * n}" fill="{color}">{html.escape(curve.subject)}</text>')
    parts.append(f'<text x="{W - PAD - 160}" y="{PAD + 16 * len(curves)}" fill="crimson">ringed: the knee</text>')
    return "\n".join(parts) + "\n</svg>\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--svg", type=Path)
    parser.add_argument("--price-per-hour", type=float)
    parser.add_argument("--target-rate", type=float)
    parser.add_argument("--slo-e2e-p99-ms", type=float)
    parser.add_argument("--noise", type=float, default=0.05, help="log-sd between instances (repeats disagree)")
    args = parser.parse_args()
    curves = sweep.read(args.folder)
    ask = Ask(slo={"e2e_p99_ms": args.slo_e2e_p99_ms} if args.slo_e2e_p99_ms else {},
              price_per_hour=args.price_per_hour, target_rate=args.target_rate)
    worths = [capacity.worth(c, ask.slo, ask.price_per_hour, ask.target_rate) for c in curves]
    print("\n".join(table(curves, worths, ask, args.noise)))
    if args.svg:
        args.svg.write_text(svg(curves, worths, f"{args.folder.name}: load curves"))
        print(f"wrote {args.svg}")


if __name__ == "__main__":
    main()
