"""Parameter-parallel training (the paper's §3.2) projected from 2 processes to 64, from nplm-bench's parallel lines.

    .venv/bin/nplm-bench experiment=mlp9 'bench.what=[parallel]' data.path=../shared/data/brown.zip > bench.jsonl
    .venv/bin/python scripts/parallel_projection.py bench.jsonl --figure docs/parallel_projection.svg

The model (docs/performance.md, "Parameter-parallel training"): one process takes t1 seconds a token
(1 / the `parallel M=1` line's tokens/s); the output layer's share s of it (`output_share`, its share of the FLOPs)
divides among M processes, the rest (the features and the hidden layer) every process repeats, and each step of B
tokens adds its Allreduces: each row's largest score and its normaliser S (B floats each), dL/da (B h floats) and,
with direct connections, dL/dx (B (n - 1) m floats). A ring Allreduce of b bytes over M processes costs
(M - 1) a + 2 (M - 1) / M x b / bw, with the latency a and bandwidth bw fitted at M = 2 (the `allreduce` line: at
M = 2 that is a + b / bw). So t_M = t1 s / M + t1 (1 - s) + comm_M / B, the speed-up is t1 / t_M, the efficiency the
speed-up over M, and the communication share comm_M / B / t_M. The AP network (|V| = 17,964, h = 60, m = 100, n = 6,
direct connections) is projected at the measured row's seconds a FLOP. The Allreduces' own times are a floor: where
the `parallel M=2` line's profiled collectives took longer a step (a process waiting for the other to reach the
collective, DTensor's own calls), a second row per network adds that excess, growing as M - 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

AP = {"vocab_size": 17_964, "h": 60, "m": 100, "n": 6, "direct": True}  # the paper's AP MLP10 (§3.2)
PROCESSES = (1, 2, 4, 8, 16, 32, 64)


def flops(net: dict[str, Any]) -> tuple[float, float]:
    """Forward FLOPs a token of eq. (1): (the output layer's, the rest's), as NPLMModule.flops_per_token counts."""
    inputs = (net["n"] - 1) * net["m"]
    width = inputs * bool(net["direct"]) + net["h"]
    return 2.0 * width * net["vocab_size"], 2.0 * inputs * net["h"]


def project(
    net: dict[str, Any], seconds_per_flop: float, allreduce: dict[str, float], batch: int, waits: float = 0.0
) -> list[dict]:
    """Each M of PROCESSES: its speed-up, efficiency and communication share (the module doc's model), with `waits`
    seconds a step at M = 2 beyond what the Allreduces' own times give, growing as M - 1."""
    output, rest = flops(net)
    t1 = 3 * (output + rest) * seconds_per_flop  # a training token: forward and backward (twice the forward)
    share = output / (output + rest)
    rows = []
    for m in PROCESSES:
        comm = 0.0 if m == 1 else allreduces(net, allreduce, batch, m) + (m - 1) * waits
        tm = t1 * share / m + t1 * (1 - share) + comm / batch
        rows.append(
            {"processes": m, "speedup": t1 / tm, "efficiency": t1 / tm / m, "communication_share": comm / batch / tm}
        )
    return rows


def allreduces(net: dict[str, Any], allreduce: dict[str, float], batch: int, m: int) -> float:
    """Seconds a step of `batch` tokens spends in its ring Allreduces over m processes (the module doc)."""
    values = 2 * batch + batch * net["h"] + batch * (net["n"] - 1) * net["m"] * bool(net["direct"])
    calls = 3 + bool(net["direct"])
    latency, bandwidth = allreduce["latency_us"] * 1e-6, allreduce["bandwidth_gb_per_s"] * 1e9
    return (m - 1) * latency * calls + 2 * (m - 1) / m * 4 * values / bandwidth


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench", type=Path, help="nplm-bench's JSON lines, with parallel M=1 and allreduce M=2")
    parser.add_argument("--figure", type=Path, help="write the efficiency against M here (.svg or .png)")
    args = parser.parse_args(argv)
    try:
        texts = args.bench.read_text().splitlines()
        lines = {line["what"]: line for line in map(json.loads, filter(str.strip, texts))}
    except (OSError, ValueError, KeyError, TypeError) as error:
        print(f"{parser.prog}: error: {args.bench} is not nplm-bench's JSON lines: {error}", file=sys.stderr)
        return 2
    if "parallel M=1" not in lines or "allreduce M=2" not in lines:
        print(f"{parser.prog}: error: {args.bench} has no 'parallel M=1' and 'allreduce M=2' lines", file=sys.stderr)
        return 2
    alone, allreduce = lines["parallel M=1"], lines["allreduce M=2"]
    row = {k: alone[k] for k in ("vocab_size", "h", "m", "n", "direct")}
    seconds_per_flop = 1 / alone["tokens_per_s"] / (3 * sum(flops(row)))
    nets = {f"measured row (|V| = {row['vocab_size']:,}, h = {row['h']})": row, "AP network (|V| = 17,964)": AP}
    batch, projected = alone["tokens_per_step"], {}
    two = lines.get("parallel M=2")
    # what M = 2's profiled steps spent in collectives beyond the Allreduces' own times: the waits for the other
    # process, DTensor's own calls
    waits = two and two["communication_share"] * batch / two["tokens_per_s"] - allreduces(row, allreduce, batch, 2)
    for name, net in nets.items():
        projected[f"{name}, from the Allreduces"] = project(net, seconds_per_flop, allreduce, batch)
        if waits and waits > 0:
            projected[f"{name}, with M = 2's measured waits"] = project(net, seconds_per_flop, allreduce, batch, waits)
    print("| network | " + " | ".join(f"M = {m}" for m in PROCESSES) + " |")
    print("|---|" + "---|" * len(PROCESSES))
    for name, rows in projected.items():
        cells = [f"{r['efficiency']:.2f} ({100 * r['communication_share']:.0f}%)" for r in rows]
        print(f"| {name.replace('|', chr(92) + '|')} | " + " | ".join(cells) + " |")  # |V| within a cell
    if args.figure:
        measured = {m: lines[f"parallel M={m}"]["x_M1"] / m for m in PROCESSES if f"parallel M={m}" in lines}
        draw(projected, measured, args.figure)
    return 0


def draw(projected: dict[str, list[dict]], measured: dict[int, float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 3.6))
    for name, rows in projected.items():
        axes.plot([r["processes"] for r in rows], [r["efficiency"] for r in rows], marker="o", label=name)
    axes.plot(list(measured), list(measured.values()), "k*", markersize=10, label="measured (nplm-bench)")
    axes.axhline(14 / 15, color="grey", linestyle="--", label="the paper's 1/15 communication (efficiency 14/15)")
    axes.set_xscale("log", base=2)
    axes.set_xlabel("processes M")
    axes.set_ylabel("efficiency (speed-up / M)")
    axes.set_ylim(0, 1.05)
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, metadata={"Date": None} if path.suffix == ".svg" else None)
    plt.close(figure)


if __name__ == "__main__":
    sys.exit(main())
