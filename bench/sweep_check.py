"""Regression check over a shape sweep (bench/sweep.py's JSON) against the last accepted run on
the same GPU kind, bench/baselines/sweep_<kind>.json. Flags rows where ropejit is more than
MAX_SLOWDOWN_PCT slower than the baseline (the heuristic's launch, and the tuned one where both
runs have it), plain-RoPE rows of COPY_TARGET_MIN_BYTES or more below COPY_TARGET_PCT of the
same-run copy, rows where ropejit is behind a peer of the same run by more than PEER_MARGIN_PCT,
and rows where ropejit failed. Rows only one side has are listed, not flagged.

Exit status: 0 nothing flagged, 1 something flagged, 2 no baseline to compare with (or one of
another format, or a file that is no sweep JSON); the same-run targets are reported either way.

    python3 bench/sweep_check.py $OUT/sweep.json                  # baseline of the run's GPU
    python3 bench/sweep_check.py $OUT/sweep.json --baseline OLD.json --tolerance 3
"""

import argparse
import json
import os
import re
import sys

# The targets of issue 52, quoted by docs/performance.md and bench/README.md.
MAX_SLOWDOWN_PCT = 5.0  # slower than the baseline's same row by more than this: flagged
COPY_TARGET_PCT = 95.0  # plain-RoPE rows this large must reach this % of a same-run copy
COPY_TARGET_MIN_BYTES = 64_000_000  # 64 MB, decimal as the docs count bytes
PEER_MARGIN_PCT = 1.0  # ropejit may trail a peer of the same run by at most this

BASELINE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "baselines")
FAILED = ("error", "wrong")


def gpu_kind(name):
    """A short GPU kind from a device name: 'NVIDIA H100 80GB HBM3' -> 'h100',
    'NVIDIA A100-SXM4-80GB' -> 'a100'; otherwise the name's words joined by '-'."""
    words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w and w != "nvidia"]
    for word in words:
        if re.fullmatch(r"[a-z]+\d+[a-z]*", word):
            return word
    return "-".join(words) or "unknown"


def baseline_path(kind, directory=BASELINE_DIR):
    return os.path.join(directory, f"sweep_{kind}.json")


def load(path):
    """The sweep JSON at `path`; exits 2 with one line naming the file when it cannot be read."""
    try:
        with open(path) as f:
            run = json.load(f)
    except (OSError, ValueError) as e:
        print(f"sweep_check: cannot read {path}: {e}", file=sys.stderr)
        sys.exit(2)
    if not isinstance(run, dict) or "rows" not in run or "header" not in run:
        print(f"sweep_check: {path} is not a sweep JSON (no header or rows)", file=sys.stderr)
        sys.exit(2)
    return run


def by_id(run):
    return {row["id"]: row for row in run["rows"]}


def slower(us, base_us, tolerance):
    return us is not None and base_us is not None and us > base_us * (1 + tolerance / 100)


def slowdowns(rows, base_rows, tolerance):
    """(id, message) for each row slower than the baseline's same row by more than tolerance
    percent: ropejit's launch, and the tuned launch where both runs timed it."""
    flags = []
    for row_id, row in rows.items():
        base = base_rows.get(row_id)
        if base is None:
            continue
        pairs = [("", row.get("ropejit_us"), base.get("ropejit_us"))]
        if "tuned" in row and "tuned" in base:
            pairs.append(("tuned ", row["tuned"].get("ropejit_us"),
                          base["tuned"].get("ropejit_us")))
        for label, us, base_us in pairs:
            if slower(us, base_us, tolerance):
                flags.append((row_id, f"{label}{us:.2f} µs against {base_us:.2f} µs "
                                      f"(+{100 * (us / base_us - 1):.1f}%)"))
    return flags


def below_copy(rows):
    """(id, message) for each plain-RoPE row of COPY_TARGET_MIN_BYTES or more under
    COPY_TARGET_PCT of its same-run contiguous copy of the bytes it moves. With partial rotary
    the message also gives the copy of the row's own access pattern (the rotary part of every
    head, bench/sweep_measure.py's pattern_copy): the standard strided copies are slower than
    ropejit there, so they show no floor and excuse nothing."""
    flags = []
    for row_id, row in rows.items():
        pct = row.get("pct_copy")
        if (row.get("family", "rope") != "rope" or row.get("bytes", 0) < COPY_TARGET_MIN_BYTES
                or pct is None or pct >= COPY_TARGET_PCT):
            continue
        pattern = ""
        if row.get("pattern_copy_us") is not None:
            pattern = (f"; the pattern's copy ({row['pattern_copy_by']}) "
                       f"{row['pattern_copy_us']:.2f} µs")
        flags.append((row_id, f"{pct:.1f}% of copy ({row['ropejit_us']:.2f} µs, copy "
                              f"{row['copy_us']:.2f} µs{pattern}, {row['bytes'] / 1e6:.1f} MB)"))
    return flags


def behind_peers(rows):
    """(id, message) for each row where a peer that passed its check is faster than ropejit
    by more than PEER_MARGIN_PCT."""
    flags = []
    for row_id, row in rows.items():
        us = row.get("ropejit_us")
        for name, peer in (row.get("peers") or {}).items():
            peer_us = peer.get("us")
            if peer.get("check_ok") and slower(us, peer_us, PEER_MARGIN_PCT):
                flags.append((row_id, f"{us:.2f} µs against {name} {peer_us:.2f} µs "
                                      f"(+{100 * (us / peer_us - 1):.1f}%)"))
    return flags


def failures(rows):
    def why(row):
        rel = row.get("rel_l2")
        return row.get("reason") or ("no result" if rel is None else f"rel L2 {rel:.2e}")
    return [(row_id, f"{row['status']}: {why(row)}") for row_id, row in rows.items()
            if row.get("status") in FAILED]


def not_compared(rows, base_rows):
    """Ids only this run has, ids only the baseline has, and ids both have that one side
    skipped (no time to compare)."""
    only_new = sorted(set(rows) - set(base_rows))
    only_base = sorted(set(base_rows) - set(rows))
    untimed = sorted(i for i in set(rows) & set(base_rows)
                     if rows[i].get("ropejit_us") is None or base_rows[i].get("ropejit_us") is None)
    return only_new, only_base, untimed


def print_section(title, flags):
    if flags:
        print(f"{title} ({len(flags)}):")
        for row_id, message in flags:
            print(f"  {row_id}: {message}")


def print_list(title, ids):
    if ids:
        print(f"{title} ({len(ids)}): " + ", ".join(ids))


def describe(path, run):
    h = run["header"]
    return f"{path} ({h.get('gpu')}, {h.get('date')}, ropejit {h.get('ropejit')})"


def same_run_flags(rows):
    sections = [("ropejit failed", failures(rows)),
                (f"below {COPY_TARGET_PCT:g}% of copy at {COPY_TARGET_MIN_BYTES / 1e6:g} MB or "
                 f"more", below_copy(rows)),
                (f"behind a peer by more than {PEER_MARGIN_PCT:g}%", behind_peers(rows))]
    for title, flags in sections:
        print_section(title, flags)
    return [flag for _, flags in sections for flag in flags]


def shown_path(path):
    """path from the repository's root where it lies inside it (as the commands run)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.abspath(path)
    return os.path.relpath(path, root) if path.startswith(root + os.sep) else path


def record_hint(kind, path):
    return (f"record one with `bash bench/run_gpu.sh OUT sweep` on an {kind} host and, after "
            f"review, `cp OUT/sweep.json {shown_path(path)}` (bench/README.md)")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweep", help="the new run's JSON (bench/sweep.py --out)")
    p.add_argument("--baseline", help="the baseline JSON (default: sweep_<kind>.json in "
                   "--baseline-dir for the GPU the run names)")
    p.add_argument("--baseline-dir", default=BASELINE_DIR, help="default %(default)s")
    p.add_argument("--tolerance", type=float, default=MAX_SLOWDOWN_PCT, metavar="PCT",
                   help="flag rows slower than the baseline by more than this many percent "
                   "(default %(default)g)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    run = load(args.sweep)
    rows = by_id(run)
    kind = gpu_kind(run["header"].get("gpu") or "")
    path = args.baseline or baseline_path(kind, args.baseline_dir)
    print(f"sweep_check: {describe(args.sweep, run)}, {len(rows)} rows")
    flags = same_run_flags(rows)
    if not os.path.isfile(path):
        print(f"{len({row_id for row_id, _ in flags})} rows flagged in this run")
        print(f"no baseline for {kind}: {record_hint(kind, path)}")
        return 2
    base = load(path)
    if base.get("format") != run.get("format"):
        print(f"baseline {path} has format {base.get('format')}, the run {run.get('format')}: "
              f"{record_hint(kind, path)}")
        return 2
    base_rows = by_id(base)
    print(f"against {describe(path, base)}")
    if gpu_kind(base["header"].get("gpu") or "") != kind:
        print(f"note: the baseline is from another GPU kind ({base['header'].get('gpu')})")
    slow = slowdowns(rows, base_rows, args.tolerance)
    print_section(f"slower than the baseline by more than {args.tolerance:g}%", slow)
    only_new, only_base, untimed = not_compared(rows, base_rows)
    print_list("not in the baseline", only_new)
    print_list("not in this run", only_base)
    print_list("untimed on one side", untimed)
    flagged = {row_id for row_id, _ in flags + slow}
    compared = len(set(rows) & set(base_rows)) - len(untimed)
    print(f"{compared} rows compared with the baseline, {len(flagged)} rows flagged")
    return 1 if flagged else 0


if __name__ == "__main__":
    sys.exit(main())
