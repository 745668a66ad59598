"""PNG plots of ropejit benchmark results: GB/s against tokens for the rope/llama_bf16_t<N>
rows of ropejit_bench's Google Benchmark JSON, next to the copy of the same bytes timed in
the same run; the sbhd sweep (sweep/sbhd_<dtype>/b<B>/s<S>) as GB/s against tokens per batch
with its copy lines; given compare_torch.py's JSON, µs per case for ropejit, torch.compile,
torch eager and the copy; and given compare_peers.py's JSON, each implementation's decode µs
(graph replay) and prefill speed as a share of the copy's.

    python3 bench/plot.py bench.json [--compare compare.json] [--peers peers.json] --outdir DIR
    python3 bench/plot.py --peers peers.json --outdir DIR
    python3 bench/plot.py --fused-peers fused_peers.json --vllm vllm.json --outdir DIR

Given compare_fused_peers.py's and compare_vllm.py's JSON: the fused steps' µs against tokens
next to FlashInfer's and vLLM's fused kernels (fused_peers_us.png). Given compare_unfused.py's
JSON (bf16, and --fp8's): the fused step against the unfused sequence it replaces, each pass the
fastest on the host, alone and as one graph (unfused_us.png).

    python3 bench/plot.py --unfused unfused.json unfused_fp8.json --outdir DIR

Given compare_proj_torch.py's JSON alone, the decode block's projection and FFN from that
harness's own rows (torch's and ropejit's paths, graph replay, one flush): proj_us.png and
ffn_us.png. `--prefix h200_` names the files of another GPU's run (h200_proj_us.png, ...).

    python3 bench/plot.py --proj-torch proj_torch.json --prefix h200_ --outdir bench/plots

Given bench/e2e_decode.py's stdout: ms per new token against batch for each patch and mode,
with the weight-read floor (e2e_<model>_ms.png; a file holding several runs gets one plot each).

    python3 bench/plot.py --e2e e2e.txt --prefix h200_ --outdir bench/plots
"""

import argparse
import json
import os
import re
import statistics
import sys

import matplotlib

matplotlib.use("Agg")  # files only: benchmark hosts have no display
import matplotlib.pyplot as plt  # noqa: E402  (must follow the backend choice)

LLAMA_ROW = re.compile(r"^rope/llama_bf16_t(\d+)(?:/|$)")
SWEEP_ROW = re.compile(r"^sweep/sbhd_(\w+)/b(\d+)/s(\d+)(?:/|$)")
COUNTERS = ("bytes", "median_us", "copy_us", "pct_copy")
# compare_torch.py's JSON fields, in the order and colours of the bars.
COMPARE_SERIES = (
    ("ropejit_us", "ropejit", "tab:blue"),
    ("compile_us", "torch.compile", "tab:orange"),
    ("eager_us", "torch eager", "tab:red"),
    ("copy_us", "copy (same bytes)", "tab:gray"),
)


def llama_rows(bench):
    """{tokens: {counter: value}} from the iteration rows that ran. Errored rows carry no
    counters and aggregate rows (mean/median/stddev of --benchmark_repetitions) would count
    a repetition twice; repeated iteration rows are reduced to their median."""
    samples = {}
    for row in bench.get("benchmarks", []):
        match = LLAMA_ROW.match(row.get("run_name") or row.get("name", ""))
        if not match or row.get("run_type", "iteration") != "iteration":
            continue
        if row.get("error_occurred"):
            why = row.get("error_message", "error")
            print(f"plot: skipping {row['name']}: {why}", file=sys.stderr)
            continue
        if not all(isinstance(row.get(c), (int, float)) and row[c] > 0 for c in COUNTERS):
            print(f"plot: skipping {row['name']}: missing counters", file=sys.stderr)
            continue
        samples.setdefault(int(match.group(1)), []).append(row)
    return {tokens: {c: statistics.median(r[c] for r in rows) for c in COUNTERS}
            for tokens, rows in sorted(samples.items())}


def plot_bandwidth(rows, gpu, path):
    tokens = list(rows)
    # bytes / µs / 1e3 = GB/s; bytes count q and k read once and written once.
    rope = [rows[t]["bytes"] / rows[t]["median_us"] / 1e3 for t in tokens]
    copy = [rows[t]["bytes"] / rows[t]["copy_us"] / 1e3 for t in tokens]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(tokens, rope, "o-", label="ropejit", color="tab:blue")
    ax.plot(tokens, copy, "s--", label="device copy, same bytes, same run", color="tab:gray")
    for t, gbps, copy_gbps in zip(tokens, rope, copy):
        # Above the point when ropejit is the faster line, below otherwise: off the copy marker.
        ax.annotate(f"{rows[t]['pct_copy']:.0f}%", (t, gbps), textcoords="offset points",
                    xytext=(0, 7 if gbps >= copy_gbps else -14), ha="center", fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(tokens, [str(t) for t in tokens])
    ax.set_xlabel("tokens (batch 1; 32 q + 8 kv heads, d128, bf16)")
    ax.set_ylabel("GB/s (q+k read and written)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"ropejit llama bf16 vs copy{' — ' + gpu if gpu else ''}\n"
                 "labels: ropejit as % of copy speed", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def sweep_rows(bench):
    """{dtype: {batch: [(tokens, rope GB/s, copy GB/s)]}} from the sbhd sweep rows that ran."""
    out = {}
    for row in bench.get("benchmarks", []):
        match = SWEEP_ROW.match(row.get("run_name") or row.get("name", ""))
        if not match or row.get("run_type", "iteration") != "iteration" or row.get("error_occurred"):
            continue
        if not all(isinstance(row.get(c), (int, float)) and row[c] > 0 for c in COUNTERS):
            continue
        dtype, batch, seq = match.group(1), int(match.group(2)), int(match.group(3))
        out.setdefault(dtype, {}).setdefault(batch, []).append(
            (batch * seq, row["bytes"] / row["median_us"] / 1e3, row["bytes"] / row["copy_us"] / 1e3))
    return out


def plot_sweep(sweep, gpu, path):
    fig, axes = plt.subplots(1, len(sweep), figsize=(6 * len(sweep), 4.5), squeeze=False)
    for ax, (dtype, batches) in zip(axes[0], sorted(sweep.items())):
        for batch, points in sorted(batches.items()):
            points.sort()
            line, = ax.plot([p[0] for p in points], [p[1] for p in points], "-", label=f"ropejit b{batch}")
            ax.plot([p[0] for p in points], [p[2] for p in points], ":", color=line.get_color(),
                    label=f"copy b{batch}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens (batch x seq; 64 q + 64 k heads, d128, sbhd)")
        ax.set_ylabel("GB/s (q+k read and written)")
        ax.set_ylim(bottom=0)
        ax.set_title(f"sbhd sweep, {dtype}{' — ' + gpu if gpu else ''}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_compare(compare, path):
    cases = compare["cases"]
    names = [c["case"] for c in cases]
    width = 0.8 / len(COMPARE_SERIES)
    fig, ax = plt.subplots(figsize=(max(7, 1.3 * len(cases)), 4.5))
    for i, (field, label, color) in enumerate(COMPARE_SERIES):
        offset = (i - (len(COMPARE_SERIES) - 1) / 2) * width
        # torch.compile can be missing: mark it n/a rather than draw a zero on a log axis.
        ran = [(j + offset, c[field]) for j, c in enumerate(cases) if c.get(field)]
        ax.bar([x for x, _ in ran], [y for _, y in ran], width, label=label, color=color)
        for j, c in enumerate(cases):
            if not c.get(field):
                ax.text(j + offset, 0.02, "n/a", transform=ax.get_xaxis_transform(), ha="center",
                        rotation=90, fontsize=7, color=color)
    ax.set_yscale("log")
    ax.set_xticks(range(len(cases)), names, rotation=20, ha="right")
    ax.set_ylabel("median device time, µs (log)")
    gpu = compare.get("context", {}).get("gpu")
    ax.set_title(f"RoPE on q and k{' — ' + gpu if gpu else ''}", fontsize=10)
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# By name, so that one implementation keeps its colour across runs with different sets.
PEER_COLORS = {"ropejit (rows)": "tab:blue", "ropejit (HF bf16 rows)": "tab:purple",
               "Liger (rows)": "tab:orange", "ropejit (ids)": "tab:cyan",
               "FlashInfer cache (ids)": "tab:green", "FlashInfer computed (ids)": "tab:olive",
               "ropejit": "tab:blue", "FlashInfer": "tab:green", "FlashInfer PDL": "tab:olive",
               "vLLM": "tab:red"}


def plot_peers(peers, path):
    """Left: decode µs per call (graph replay) for every implementation, grouped by tokens, with
    the same-run copies as a line. Right: prefill speed as a percentage of the copy's."""
    cases = peers["cases"]
    impls = list(cases[0]["impls"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5),
                                      gridspec_kw={"width_ratios": [2, 1]})
    width = 0.8 / len(impls)
    for side, decode in ((left, True), (right, False)):
        chosen = [c for c in cases if c["case"].startswith("decode") == decode]
        for i, name in enumerate(impls):
            offset = (i - (len(impls) - 1) / 2) * width
            xs, ys = [], []
            for j, c in enumerate(chosen):
                us = c["impls"][name].get("us")
                if us:
                    xs.append(j + offset)
                    ys.append(us if decode else 100.0 * c["copy_us"] / us)
            side.bar(xs, ys, width, label=name, color=PEER_COLORS.get(name, f"C{i}"))
        labels = [c["case"].replace("decode_t", "").replace("prefill_t", "") for c in chosen]
        side.set_xticks(range(len(chosen)), labels)
        side.set_xlabel("tokens")
        side.grid(True, axis="y", alpha=0.3)
        if decode:
            side.plot(range(len(chosen)), [c["copy_us"] for c in chosen], "k--", marker="o",
                      label=chosen[0].get("copy_kind", "copy") if chosen else "copy")
            side.set_ylabel("µs per call, CUDA-graph replay (lower is better)")
            side.legend(fontsize=7)
        else:
            side.set_ylabel("% of a same-run copy's speed (L2 flushed)")
            side.set_ylim(50, 105)
    gpu = peers.get("context", {}).get("gpu")
    fig.suptitle(f"RoPE on q and k, 32q/8kv heads, d128, bf16{' — ' + gpu if gpu else ''}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_fused(fused_peers, vllm, path):
    """µs per graph-replayed call against tokens (log-log) of the fused steps next to the peers'
    fused kernels: compare_fused_peers.py's FP8 serving step (FlashInfer with and without its
    programmatic launch) and compare_vllm.py's cases, one panel each."""
    panels = []
    if fused_peers:
        panels.append(("RoPE + FP8 q + FP8 paged append (Llama-3-8B)", fused_peers["rows"]))
    if vllm:
        titles = {"in_place": "QK-norm + RoPE in place (Qwen3-8B)",
                  "cache_bf16": "QK-norm + RoPE + bf16 cache (slots)",
                  "cache_fp8": "QK-norm + RoPE + FP8 cache (slots)"}
        for case, title in titles.items():
            rows = [r for r in vllm["rows"] if r["case"] == case]
            if rows:
                panels.append((title, rows))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.2), squeeze=False)
    for ax, (title, rows) in zip(axes[0], panels):
        names = [n for n in rows[0]["impls"] if isinstance(rows[0]["impls"][n], dict)]
        for i, name in enumerate(names):
            pts = [(r["tokens"], r["impls"][name]["us"]) for r in rows
                   if "us" in r["impls"].get(name, {})]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=name, color=PEER_COLORS.get(name, f"C{i}"))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens")
        ax.set_title(title, fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("µs per call, CUDA-graph replay (lower is better)")
    gpu = (fused_peers or vllm or {}).get("gpu")
    fig.suptitle(f"Fused steps against the peers' fused kernels{' — ' + gpu if gpu else ''}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_unfused(runs, path):
    """µs per graph-replayed step against tokens (log-log), one panel per compare_unfused.py run:
    the fused step, the unfused sequence as one graph, and each of its passes timed alone."""
    fig, axes = plt.subplots(1, len(runs), figsize=(5.2 * len(runs), 4.2), squeeze=False)
    for ax, run in zip(axes[0], runs):
        rows = sorted(run["rows"], key=lambda r: r["tokens"])
        tokens = [r["tokens"] for r in rows]
        ax.plot(tokens, [r["fused_us"] for r in rows], marker="o", color="tab:blue",
                label="ropejit fused step")
        ax.plot(tokens, [r["unfused_us"] for r in rows], marker="s", color="tab:red",
                label="unfused sequence (one graph)")
        pass_colors = ("tab:green", "tab:purple", "tab:brown", "tab:olive")
        for i, step in enumerate(rows[0]["chosen"]):
            pts = [(r["tokens"], r["passes"][step][r["chosen"][step]]) for r in rows]
            ax.plot(*zip(*pts), linestyle="--", linewidth=1, color=pass_colors[i % 4],
                    label=f"{step} alone ({rows[0]['chosen'][step]})")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens")
        ax.set_title("FP8 q and FP8 paged cache" if run.get("fp8") else "bf16 q and bf16 paged cache",
                     fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("µs per step, CUDA-graph replay (lower is better)")
    gpu = runs[0].get("gpu")
    fig.suptitle("Qwen3-style step (QK-norm + RoPE + paged append): fused against unfused"
                 f"{' — ' + gpu if gpu else ''}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def e2e_runs(path):
    """[(header, rows)] of bench/e2e_decode.py's stdout, a run per header line (GPU, model,
    floor): the rows of each run, the merged ones with device times winning (printed last)."""
    runs = []
    with open(path) as f:
        for line in f:
            if not line.startswith("{"):
                continue
            row = json.loads(line)
            if "floor_ms" in row:
                runs.append((row, {}))
            elif "ms_per_token" in row and runs:
                runs[-1][1][(row["patch"], row["mode"], row["batch"])] = row
    return [(header, list(rows.values())) for header, rows in runs if rows]


def plot_e2e(header, rows, path):
    """ms per new token against batch, one line per patch and mode, with the weight-read floor
    (log-log)."""
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    styles = {"none": ("tab:gray", "transformers"), "rope": ("tab:orange", 'fuse="rope"'),
              "all": ("tab:blue", 'fuse="all"')}
    for (patch, mode) in sorted({(r["patch"], r["mode"]) for r in rows}):
        pts = sorted((r["batch"], r["ms_per_token"]) for r in rows
                     if (r["patch"], r["mode"]) == (patch, mode))
        color, name = styles.get(patch, ("tab:green", patch))
        ax.plot(*zip(*pts), marker="o" if mode == "compile" else "s", color=color,
                linestyle="-" if mode == "compile" else ":",
                label=f"{name}, {'static cache + compile' if mode == 'compile' else 'eager'}")
    batches = sorted({r["batch"] for r in rows})
    ax.plot(batches, [header["floor_ms"]] * len(batches), color="black", linewidth=1,
            linestyle="--", label=f"weight-read floor ({header['floor_ms']:.2f} ms)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch (sequences decoding together)")
    ax.set_ylabel("ms per new token (lower is better)")
    ax.set_title(f"{header['model']}, {header['layers']} layers — {header['gpu']}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def proj_rows(bench):
    """tokens -> (median µs, floor µs) of the proj/llama3_8b_m<M> rows."""
    rows = {}
    for b in bench.get("benchmarks", []):
        m = re.match(r"proj/llama3_8b_m(\d+)/", b.get("name", ""))
        if m and "median_us" in b and "floor_us" in b:
            rows[int(m.group(1))] = (b["median_us"], b["floor_us"])
    return dict(sorted(rows.items()))


def proj_path_rows(bench, prefix="proj_path"):
    """path -> {tokens: median µs} of the <prefix>/m<M>/<path> rows, and tokens -> (floor µs,
    read-pass µs or None): the rows of a read-flushed run carry read_us, a read-only pass over
    the weight after the same flush, which is then the floor drawn."""
    paths, floor = {}, {}
    for b in bench.get("benchmarks", []):
        m = re.match(prefix + r"/m(\d+)/(\w+)", b.get("name", ""))
        if m and "median_us" in b:
            paths.setdefault(m.group(2), {})[int(m.group(1))] = b["median_us"]
            floor[int(m.group(1))] = (b.get("floor_us", 0), b.get("read_us"))
    return {k: dict(sorted(v.items())) for k, v in paths.items()}, dict(sorted(floor.items()))


def torch_harness_paths(torch_rows):
    """The path rows of compare_proj_torch.py's own ropejit columns (graph replay, same flush as
    torch's rows), in proj_path_rows' form; ({}, {}) when it ran with --no-ropejit."""
    paths, floor = {}, {}
    for r in torch_rows or []:
        for p in ("fused", "unfused", "auto"):
            if f"ropejit_{p}_graph_us" in r:
                paths.setdefault(p, {})[r["tokens"]] = r[f"ropejit_{p}_graph_us"]
        floor[r["tokens"]] = (r["floor_us"], None)
    return (paths, floor) if paths else ({}, {})


def plot_proj(rows, torch_rows, gpu, path, path_rows=None,
              title="Llama-3-8B QKV projection (4096 → 6144, bf16)",
              unfused_label="ropejit unfused (RMSNorm key, cuBLASLt, RoPE key)"):
    """The decode block's projection: µs against tokens for the fused kernel (and, from the
    proj_path rows, the unfused path and the automatic choice), the unfused torch block (graph
    replay and eager), cuBLAS's F.linear alone, and the weight-read floor."""
    fig, ax = plt.subplots(figsize=(9.5, 4.5))
    paths, floor = path_rows or ({}, {})
    tokens = []
    if paths:
        tokens = list(floor)
        styles = {"fused": ("o-", "tab:blue", "ropejit fused kernel"),
                  "unfused": ("D-", "tab:purple", unfused_label),
                  "auto": ("x--", "black", "ropejit automatic (tuning file or heuristic)")}
        for name, (marker, color, label) in styles.items():
            if name in paths:
                t = list(paths[name])
                ax.plot(t, [paths[name][x] for x in t], marker, color=color, label=label)
        if all(floor[t][1] for t in tokens):
            ax.plot(tokens, [floor[t][1] for t in tokens], "k:",
                    label="read-only pass over the weight (same L2 flush)")
        else:
            ax.plot(tokens, [floor[t][0] for t in tokens], "k:",
                    label="weight-read floor (copy bandwidth)")
    elif rows:
        tokens = list(rows)
        ax.plot(tokens, [rows[t][0] for t in tokens], "o-", color="tab:blue",
                label="ropejit fused (RMSNorm + QKV + RoPE)")
        ax.plot(tokens, [rows[t][1] for t in tokens], "k--",
                label="weight-read floor (copy bandwidth)")
    if torch_rows:
        t2 = [r["tokens"] for r in torch_rows]
        tokens = sorted(set(tokens) | set(t2))  # the axis' ticks cover both
        ax.plot(t2, [r["unfused_graph_us"] for r in torch_rows], "s-", color="tab:orange",
                label="torch unfused, graph replay")
        ax.plot(t2, [r["unfused_us"] for r in torch_rows], "s:", color="tab:orange", alpha=0.6,
                label="torch unfused, eager")
        ax.plot(t2, [r["linear_graph_us"] for r in torch_rows], "^-", color="tab:green",
                label="F.linear alone (cuBLAS), graph replay")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ticks = [t for t in tokens if t & (t - 1) == 0]  # powers of two: 24 and 48 would crowd
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.set_xlabel("tokens (M)")
    ax.set_ylabel("µs per call, L2 emptied first (lower is better)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(f"{title}{' — ' + gpu if gpu else ''}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench", nargs="?",
                        help="Google Benchmark JSON from ropejit_bench --benchmark_out")
    parser.add_argument("--compare", help="JSON written by bench/compare_torch.py")
    parser.add_argument("--peers", help="JSON written by bench/compare_peers.py")
    parser.add_argument("--proj", help="ropejit_bench JSON with the proj/ rows "
                                       "(bench/run_gpu.sh proj writes proj.json)")
    parser.add_argument("--proj-torch", help="JSON written by bench/compare_proj_torch.py (alone: "
                                             "its own ropejit columns are the ropejit curves)")
    parser.add_argument("--prefix", default="",
                        help="prepended to the file names written (e.g. h200_)")
    parser.add_argument("--fused-peers", help="JSON written by bench/compare_fused_peers.py")
    parser.add_argument("--vllm", help="JSON written by bench/compare_vllm.py")
    parser.add_argument("--unfused", nargs="+",
                        help="JSON written by bench/compare_unfused.py (bf16 and/or --fp8)")
    parser.add_argument("--e2e", help="stdout of bench/e2e_decode.py (JSON lines): ms per token "
                        "against batch (e2e_<model>_ms.png)")
    parser.add_argument("--outdir", default="bench/plots")
    args = parser.parse_args()
    os.makedirs(args.outdir, exist_ok=True)

    if not (args.bench or args.compare or args.peers or args.proj or args.proj_torch or
            args.fused_peers or args.vllm or args.unfused or args.e2e):
        parser.error("nothing to plot: give a benchmark JSON, --compare, --peers, --proj, "
                     "--proj-torch, --fused-peers, --vllm, --unfused or --e2e")
    written = []
    if args.e2e:
        runs = e2e_runs(args.e2e)
        if not runs:
            parser.error(f"--e2e {args.e2e}: no rows of bench/e2e_decode.py in it")
        for i, (header, rows) in enumerate(runs):
            path = os.path.join(args.outdir, f"{args.prefix}e2e_{header['model']}_ms"
                                             f"{'' if i == 0 else f'_{i + 1}'}.png")
            plot_e2e(header, rows, path)
            written.append(path)
    if args.unfused:
        runs = []
        for name in args.unfused:
            with open(name) as f:
                runs.append(json.load(f))
        path = os.path.join(args.outdir, args.prefix + "unfused_us.png")
        plot_unfused(runs, path)
        written.append(path)
    if args.fused_peers or args.vllm:
        loaded = []
        for name in (args.fused_peers, args.vllm):
            loaded.append(None)
            if name:
                with open(name) as f:
                    loaded[-1] = json.load(f)
        path = os.path.join(args.outdir, args.prefix + "fused_peers_us.png")
        plot_fused(*loaded, path)
        written.append(path)
    if args.bench:
        with open(args.bench) as f:
            bench = json.load(f)
        rows = llama_rows(bench)
        if rows:
            path = os.path.join(args.outdir, args.prefix + "llama_bf16_gbps.png")
            plot_bandwidth(rows, bench.get("context", {}).get("gpu"), path)
            written.append(path)
        else:
            print(f"plot: no usable rope/llama_bf16_t<N> rows in {args.bench}", file=sys.stderr)
        sweep = sweep_rows(bench)
        if sweep:
            path = os.path.join(args.outdir, args.prefix + "sweep_sbhd_gbps.png")
            plot_sweep(sweep, bench.get("context", {}).get("gpu"), path)
            written.append(path)
    if args.peers:
        with open(args.peers) as f:
            peers = json.load(f)
        path = os.path.join(args.outdir, args.prefix + "peers_us.png")
        plot_peers(peers, path)
        written.append(path)
    if args.compare:
        with open(args.compare) as f:
            compare = json.load(f)
        path = os.path.join(args.outdir, args.prefix + "compare_us.png")
        plot_compare(compare, path)
        written.append(path)
    if args.proj:
        with open(args.proj) as f:
            bench = json.load(f)
        torch_rows = None
        if args.proj_torch:
            with open(args.proj_torch) as f:
                torch_rows = json.load(f)["rows"]
        rows = proj_rows(bench)
        path_rows = proj_path_rows(bench)
        paths = path_rows[0]
        ffn_path_rows = proj_path_rows(bench, "ffn_path")
        for name, found in (("QKV projection", paths), ("FFN gate/up", ffn_path_rows[0])):
            if not found.get("auto"):
                continue
            # The chooser against the better of the two paths, per token count.
            print(f"{name}:\n| M | fused µs | unfused µs | automatic µs | automatic / best |")
            print("|---|---|---|---|---|")
            for t, auto in found["auto"].items():
                f, u = found.get("fused", {}).get(t), found.get("unfused", {}).get(t)
                best = min(x for x in (f, u) if x is not None)
                print(f"| {t} | {f:.1f} | {u:.1f} | {auto:.1f} | {auto / best:.3f} |")
        if ffn_path_rows[0]:
            path = os.path.join(args.outdir, args.prefix + "ffn_us.png")
            ffn_torch = None
            if args.proj_torch:
                with open(args.proj_torch) as f:
                    ffn_torch = json.load(f).get("ffn_rows")
            plot_proj({}, ffn_torch, bench.get("context", {}).get("gpu"), path, ffn_path_rows,
                      title="Llama-3-8B FFN gate/up (4096 → 2 × 14336, bf16, SiLU)",
                      unfused_label="ropejit unfused (RMSNorm key, cuBLASLt, GLU key)")
            written.append(path)
        if rows or paths:
            path = os.path.join(args.outdir, args.prefix + "proj_us.png")
            plot_proj(rows, torch_rows, bench.get("context", {}).get("gpu"), path, path_rows)
            written.append(path)
        else:
            print(f"plot: no proj/llama3_8b_m<M> rows in {args.proj}", file=sys.stderr)
    if args.proj_torch and not args.proj:
        with open(args.proj_torch) as f:
            harness = json.load(f)
        for rows_key, name, title, label in (
                ("rows", "proj_us.png", "Llama-3-8B QKV projection (4096 → 6144, bf16)",
                 "ropejit unfused (RMSNorm key, cuBLASLt, RoPE key)"),
                ("ffn_rows", "ffn_us.png", "Llama-3-8B FFN gate/up (4096 → 2 × 14336, bf16, SiLU)",
                 "ropejit unfused (RMSNorm key, cuBLASLt, GLU key)")):
            found = harness.get(rows_key)
            if not found:
                continue
            path = os.path.join(args.outdir, args.prefix + name)
            plot_proj({}, found, harness.get("gpu"), path, torch_harness_paths(found),
                      title=title, unfused_label=label)
            written.append(path)
    for path in written:
        print(f"wrote {path}")
    if not written:
        sys.exit(1)


if __name__ == "__main__":
    main()
