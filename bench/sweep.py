"""Shape sweep of plain RoPE: ropejit's launch as the built-in heuristic picks it, on a grid of
shapes no one tuned on, each next to a same-run device copy of the same bytes. With --tuning
FILE the tuning file's launch too (timed in a second process: the library decides a key's
launch once per process); with --peers torch.compile of the HF formula and Liger-Kernel.
Every result is checked against float64 before it is timed. Writes one JSON, the input of
bench/sweep_check.py, and prints the rows furthest below the copy.

The grid (bench/sweep_grid.py) is a deterministic subset of the axes' product in which every
pair of axis values appears, plus issue 52's race shapes; --full takes the whole product.
Axis options (--dtypes, --tokens, ...) build the grid over other values (rows a baseline may
not have); --filter REGEX and --max-rows pick rows of the grid. Every call is in place with
int64 position ids, timed per call with the L2 flushed before it (decode sizes too: graph
replay is compare_peers.py's).

    python3 bench/sweep.py --dry-run                               # the grid; no torch, no GPU
    python3 bench/sweep.py --lib build-gpu/libropejit.so --out $OUT/sweep.json
    python3 bench/sweep.py --lib build-gpu/libropejit.so --tuning bench/tuning_h200.json \\
        --peers --out $OUT/sweep.json
"""

import argparse
import datetime
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sweep_grid import AXES, GRID_SEED, Row, grid  # noqa: E402  (bench/ is not a package)

# Incremented whenever a row's fields change meaning: sweep_check.py compares only runs of
# one format.
SWEEP_FORMAT = 1
DEFAULT_MAX_BYTES = 4 << 30


def one_of(axis):
    """A parser of one value of an axis whose values are names: only the names AXES knows."""
    def parse(value):
        if value not in AXES[axis]:
            raise ValueError(f"{value!r} is not one of {', '.join(AXES[axis])}")
        return value
    return parse


def heads(value):
    q_heads, k_heads = value.split("-")
    return int(q_heads), int(k_heads)


AXIS_OPTIONS = {  # option -> (axis, parser of one value)
    "dtypes": ("dtype", one_of("dtype")),
    "heads": ("heads", heads),
    "head_dims": ("head_dim", int),
    "rotary": ("rotary", one_of("rotary")),
    "styles": ("style", one_of("style")),
    "layouts": ("layout", one_of("layout")),
    "tokens": ("tokens", int),
    "freqs": ("freqs", one_of("freqs")),
}


def parse_size(text):
    """Bytes from '4G', '512M', '65536' (binary units)."""
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    unit = text[-1:].upper()
    return int(float(text[:-1]) * scale[unit]) if unit in scale else int(text)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lib", help="a build's libropejit.so, used with the source tree's "
                   "python/ropejit (default: the installed package)")
    p.add_argument("--out", default="sweep.json", help="JSON output path")
    p.add_argument("--dry-run", action="store_true",
                   help="print the grid's rows and bytes; imports neither torch nor ropejit")
    p.add_argument("--full", action="store_true", help="the whole product of the axes")
    for option, (axis, _) in AXIS_OPTIONS.items():
        shown = ",".join("-".join(map(str, v)) if isinstance(v, tuple) else str(v)
                         for v in AXES[axis])
        p.add_argument("--" + option.replace("_", "-"), metavar="LIST",
                       help=f"comma-separated {axis} values (default {shown})")
    p.add_argument("--filter", metavar="REGEX", help="only rows whose id matches (re.search)")
    p.add_argument("--max-rows", type=int, help="only the first N rows (after --filter)")
    p.add_argument("--max-bytes", type=parse_size, default=DEFAULT_MAX_BYTES,
                   help="skip rows whose buffers exceed this many bytes (K, M, G suffixes; "
                   "default 4G)")
    p.add_argument("--tuning", metavar="FILE", help="also time the launch this tuning file "
                   "picks (ROPEJIT_TUNING_FILE in a second process)")
    p.add_argument("--peers", action="store_true", help="also time torch.compile of the HF "
                   "formula and Liger-Kernel (each reported in the row when it fails)")
    p.add_argument("--worst", type=int, default=20, help="rows in the printed table")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--reps", type=int, default=100)
    p.add_argument("--tuned-pass", metavar="DIR", help=argparse.SUPPRESS)  # the child process
    return p.parse_args(argv)


def chosen_axes(args):
    """AXES with the values the axis options name; None when no option is given."""
    given = {o: getattr(args, o) for o in AXIS_OPTIONS if getattr(args, o) is not None}
    if not given:
        return None
    axes = dict(AXES)
    for option, text in given.items():
        axis, parse = AXIS_OPTIONS[option]
        try:
            axes[axis] = tuple(parse(v) for v in text.split(","))
        except ValueError as e:
            sys.exit(f"sweep: --{option.replace('_', '-')} {text}: {e}")
    return axes


def select_rows(args):
    axes = chosen_axes(args)
    # The pinned race shapes belong to the default grid, whose values they share.
    rows = grid(axes, full=args.full, pinned=axes is None)
    if args.filter:
        rows = [r for r in rows if re.search(args.filter, r.id)]
    return rows[:args.max_rows] if args.max_rows is not None else rows


def grid_options(args):
    axes = chosen_axes(args) or AXES
    return {"mode": "full" if args.full else "pairwise", "seed": GRID_SEED,
            "axes": {name: list(values) for name, values in axes.items()},
            "pinned": chosen_axes(args) is None, "filter": args.filter,
            "max_rows": args.max_rows, "max_bytes": args.max_bytes}


def skip_reason(row, max_bytes):
    if row.device_bytes <= max_bytes:
        return None
    return (f"needs {row.device_bytes / 2**30:.1f} GiB of buffers, over --max-bytes "
            f"{max_bytes / 2**30:.1f} GiB")


def base_entry(row, max_bytes):
    """What a row is before it is measured: id, axes, bytes, and whether it is skipped."""
    entry = {"id": row.id, "family": "rope", "axes": row.axes(), "bytes": row.bytes_moved,
             "device_bytes": row.device_bytes}
    reason = skip_reason(row, max_bytes)
    if reason:
        entry.update(status="skipped", reason=reason)
    return entry


def print_dry_run(rows, args):
    skipped = sum(skip_reason(r, args.max_bytes) is not None for r in rows)
    mode = "the full product" if args.full else f"every pair of axis values (seed {GRID_SEED})"
    print(f"# {len(rows)} rows, {mode}; {skipped} over --max-bytes")
    for row in rows:
        reason = skip_reason(row, args.max_bytes)
        print(f"{row.id:<48} {row.bytes_moved / 1e6:>10.2f} MB"
              + (f"  skipped: {reason}" if reason else ""))


def import_torch_and_ropejit(lib):
    """torch and ropejit, with ROPEJIT_TUNING as the caller set it before the import."""
    import torch
    if not torch.cuda.is_available():
        sys.exit("sweep: no CUDA device visible to torch; nothing to measure (--dry-run lists "
                 "the grid)")
    from compare_torch import import_ropejit
    return torch, import_ropejit(lib)


def measure_entries(entries, lib, timing_args, peers, label=""):
    """Measures every entry not skipped, in place; prints a line per row."""
    from compare_torch import FLUSH_BYTES
    torch, ropejit = import_torch_and_ropejit(lib)
    import sweep_measure
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    timing = (flush, *timing_args)
    for i, entry in enumerate(entries):
        if entry.get("status") == "skipped":
            continue
        entry.update(sweep_measure.measure_row(ropejit, Row.from_axes(entry["axes"]), timing,
                                               peers))
        print(f"{label}[{i + 1}/{len(entries)}] {entry['id']}: {row_summary(entry)}", flush=True)
    return torch, ropejit


def row_summary(entry):
    if entry.get("ropejit_us") is None:
        rel = entry.get("rel_l2")
        return f"{entry.get('status')}: " + (entry.get("reason") or f"rel L2 {rel:.2e}")
    pattern = ""
    if entry.get("pct_pattern_copy") is not None:
        pattern = (f", {entry['pct_pattern_copy']:.1f}% of the pattern's copy "
                   f"({entry['pattern_copy_by']} {entry['pattern_copy_us']:.2f} µs)")
    return (f"{entry['ropejit_us']:.2f} µs, copy {entry['copy_us']:.2f} µs, "
            f"{entry['pct_copy']:.1f}% of copy{pattern}, rel L2 {entry['rel_l2']:.2e}")


def tuned_pass(args):
    """The child process: measures the rows in DIR/rows.json with the tuning file the parent
    named in the environment, and writes DIR/tuned.json (id -> fields)."""
    with open(os.path.join(args.tuned_pass, "rows.json")) as f:
        entries = json.load(f)
    measure_entries(entries, args.lib, (args.warmup, args.reps), peers=False, label="tuned ")
    keep = ("copy_us", "ropejit_us", "pct_copy", "pattern_copy_us", "pattern_copy_by",
            "pct_pattern_copy", "rel_l2", "check_ok", "status", "reason")
    tuned = {e["id"]: {k: e[k] for k in keep if k in e} for e in entries}
    with open(os.path.join(args.tuned_pass, "tuned.json"), "w") as f:
        json.dump(tuned, f)


def run_tuned_pass(args, entries):
    """Each entry's `tuned` fields, from a second process with ROPEJIT_TUNING_FILE set."""
    tuning = os.path.abspath(args.tuning)  # the library ignores a relative path
    env = dict(os.environ, ROPEJIT_TUNING_FILE=tuning, ROPEJIT_TUNING="use")
    todo = [{"id": e["id"], "axes": e["axes"]} for e in entries if e.get("status") != "skipped"]
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "rows.json"), "w") as f:
            json.dump(todo, f)
        cmd = [sys.executable, os.path.abspath(__file__), "--tuned-pass", tmp,
               "--warmup", str(args.warmup), "--reps", str(args.reps)]
        if args.lib:
            cmd += ["--lib", args.lib]
        done = subprocess.run(cmd, env=env).returncode
        tuned = {}
        if os.path.exists(os.path.join(tmp, "tuned.json")):
            with open(os.path.join(tmp, "tuned.json")) as f:
                tuned = json.load(f)
    for entry in entries:
        if entry.get("status") != "skipped":
            entry["tuned"] = tuned.get(entry["id"], {"status": "error", "reason":
                                                     f"the tuned pass exited with {done}"})


def command_output(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30,
                              check=True).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def peer_versions():
    from importlib.metadata import PackageNotFoundError, version
    out = {}
    for package in ("liger-kernel", "triton"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            out[package] = None
    return out


def header(args, torch, ropejit):
    here = os.path.dirname(os.path.abspath(__file__))
    driver = command_output(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    return {
        "gpu": torch.cuda.get_device_name(),
        "driver": driver.splitlines()[0] if driver else None,
        "cuda": torch.version.cuda, "torch": torch.__version__, "ropejit": ropejit.__version__,
        "commit": command_output(["git", "-C", here, "describe", "--always", "--dirty"]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(["python3", *sys.argv]),
        "grid": grid_options(args),
        "timing": {"warmup": args.warmup, "reps": args.reps, "statistic": "median",
                   "l2": "flushed before each repetition"},
        "launch": "heuristic (ROPEJIT_TUNING=off)",
        "tuning": os.path.abspath(args.tuning) if args.tuning else None,
        "peers": peer_versions() if args.peers else None,
    }


def fmt(value, spec=".2f", suffix=""):
    return "n/a" if value is None else format(value, spec) + suffix


def tuned_cell(entry):
    tuned = entry.get("tuned")
    if tuned is None:
        return None
    if tuned.get("ropejit_us") is None:
        return tuned.get("status", "n/a")
    return f"{tuned['ropejit_us']:.2f} ({tuned['pct_copy']:.1f}%)"


def peer_cell(entry, name):
    peer = entry.get("peers", {}).get(name, {})
    if "us" in peer:
        return fmt(peer["us"])
    return "error" if "error" in peer else "wrong" if "check_ok" in peer else "n/a"


def print_worst(entries, n, tuned, peers):
    """The n measured rows furthest below the copy, as a markdown table."""
    measured = sorted((e for e in entries if e.get("pct_copy") is not None),
                      key=lambda e: e["pct_copy"])
    names = ["torch.compile", "liger"] if peers else []
    cols = ["row", "MB", "copy µs", "ropejit µs", "% of copy", "% of pattern copy"]
    cols += ["tuned µs (% of copy)"] if tuned else []
    cols += [f"{name} µs" for name in names]
    print(f"\n{min(n, len(measured))} of {len(measured)} measured rows, lowest % of copy first:")
    print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for e in measured[:n]:
        cells = [e["id"], f"{e['bytes'] / 1e6:.2f}", fmt(e["copy_us"]), fmt(e["ropejit_us"]),
                 fmt(e["pct_copy"], ".1f", "%"),
                 fmt(e["pct_pattern_copy"], ".1f", "%") if "pct_pattern_copy" in e else "—"]
        cells += [tuned_cell(e) or "n/a"] if tuned else []
        cells += [peer_cell(e, name) for name in names]
        print("| " + " | ".join(cells) + " |")
    for status in ("skipped", "error", "wrong"):
        ids = [e["id"] for e in entries if e.get("status") == status]
        if ids:
            print(f"{status} ({len(ids)}): " + ", ".join(ids))


def main(argv=None):
    args = parse_args(argv)
    if args.tuned_pass:
        return tuned_pass(args)
    rows = select_rows(args)
    if args.dry_run:
        try:
            print_dry_run(rows, args)
            sys.stdout.flush()
        except BrokenPipeError:  # `--dry-run | head`: the reader has what it wanted
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return
    if args.tuning and not os.path.isfile(args.tuning):
        sys.exit(f"sweep: --tuning {args.tuning}: no such file")
    os.environ["ROPEJIT_TUNING"] = "off"  # the heuristic's launch, whatever tuning file exists
    entries = [base_entry(row, args.max_bytes) for row in rows]
    torch, ropejit = measure_entries(entries, args.lib, (args.warmup, args.reps), args.peers)
    if args.tuning:
        run_tuned_pass(args, entries)
    with open(args.out, "w") as f:
        json.dump({"format": SWEEP_FORMAT, "header": header(args, torch, ropejit),
                   "rows": entries}, f, indent=1)
    print_worst(entries, args.worst, bool(args.tuning), args.peers)
    print(f"\nwrote {args.out}; check it with: python3 bench/sweep_check.py {args.out}")
    if any(e.get("status") in ("error", "wrong") for e in entries):
        sys.exit("sweep: ropejit failed the float64 check or raised on some rows (above)")


if __name__ == "__main__":
    main()
