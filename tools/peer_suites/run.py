#!/usr/bin/env python3
"""Runs the peers' own RoPE test suites, unchanged, against ropejit.dropin, offline: each suite's
files from DIR (tools/peer_suites/fetch.sh) are laid out with shims/<suite> over them in a temp
dir and run by pytest with ropejit_peer_plugin, which swaps the peer's kernel entry points for
the drop-ins. Prints a markdown table of outcomes and the distinct failure reasons.

    tools/peer_suites/run.py --peers .peer-suites --lib build/libropejit.so [--suite te ...]
        [--out results.json] [--collect-only] [-- PYTEST_ARGS]
"""

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

# suite: (peer, its test file, folders of the suite to put on the path besides its root)
SUITES = {
    "te": ("TransformerEngine", "tests/pytorch/test_fused_rope.py", []),
    "flash": ("flash-attention", "tests/test_rotary.py", []),
    "liger": ("Liger-Kernel", "test/transformers/test_rope.py", ["src"]),
    "vllm": ("vLLM", "tests/kernels/core/test_pos_encoding.py", []),
}
OUTCOMES = ("passed", "failed", "error", "skipped")


def lay_out(peers, suite, work):
    """The peer's files with our shims over them; a shim never hides a peer file."""
    tree = work / suite
    shutil.copytree(peers / suite, tree)
    shims = HERE / "shims" / suite
    for shim in sorted(shims.rglob("*.py")) if shims.is_dir() else []:
        target = tree / shim.relative_to(shims)
        if target.exists():
            sys.exit(f"run.py: shim {shim} would replace the peer's {target.relative_to(tree)}")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shim, target)
    return tree


def run_suite(suite, tree, site, args, pytest_args):
    test, extra_paths = SUITES[suite][1], SUITES[suite][2]
    results = tree.parent / f"{suite}.json"
    env = dict(os.environ, ROPEJIT_PEER_SUITE=suite, ROPEJIT_PEER_RESULTS=str(results),
               PYTHONDONTWRITEBYTECODE="1")
    path = [tree, *(tree / p for p in extra_paths), site, HERE]
    if args.lib:
        env["ROPEJIT_LIB"] = str(args.lib)
        path.append(REPO / "python")
    env["PYTHONPATH"] = os.pathsep.join([*map(str, path), env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep)
    command = [sys.executable, "-m", "pytest", test, "-p", "ropejit_peer_plugin",
               "-p", "no:cacheprovider", "--rootdir", str(tree), "--tb=no", "-rN"]
    command += ["--collect-only", "-qq"] if args.collect_only else ["-q"]
    print(f"\n## {SUITES[suite][0]}: {' '.join(command[1:])}", flush=True)
    code = subprocess.run(command + pytest_args, cwd=tree, env=env).returncode
    if not results.exists():
        return {"error": f"pytest exited with {code} before reporting"}
    return json.loads(results.read_text())


def summarize(suite, peers, outcome):
    source = peers / suite / "SOURCE"
    summary = {"peer": SUITES[suite][0],
               "source": source.read_text().strip() if source.exists() else "not fetched"}
    if "tests" not in outcome:
        return {**summary, **outcome}
    tests = outcome["tests"]
    counts = collections.Counter(t["outcome"] for t in tests.values())
    reasons = collections.Counter(t["reason"] for t in tests.values()
                                  if t["outcome"] in ("failed", "error"))
    reasons.update(e["reason"] for e in outcome["collect_errors"])
    return {**summary, "collected": outcome["collected"],
            "collect_errors": len(outcome["collect_errors"]),
            **{o: counts[o] for o in OUTCOMES}, "reasons": reasons.most_common(),
            "swaps": outcome["header"], "tests": tests}


def print_table(summaries, collect_only):
    columns = ["collected", "collect_errors"] + ([] if collect_only else list(OUTCOMES))
    print("\n| peer | release | " + " | ".join(columns) + " |")
    print("|---|---|" + "---|" * len(columns))
    for s in summaries:
        release = s["source"].split()[1] if len(s["source"].split()) > 1 else s["source"]
        cells = [str(s.get(c, "")) for c in columns]
        print(f"| {s['peer']} | {release} | " + " | ".join(cells) + " |")
    for s in summaries:
        if s.get("error") or s.get("reasons"):
            print(f"\n{s['peer']}:")
        if s.get("error"):
            print(f"- {s['error']}")
        for reason, count in s.get("reasons", []):
            print(f"- {count} x {reason}")


def unpack_wheels(peers, site):
    for wheel in sorted((peers / "wheels").glob("*.whl")):
        with zipfile.ZipFile(wheel) as z:
            z.extractall(site)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", type=Path, default=REPO / ".peer-suites",
                        help="the folder fetch.sh filled (default: .peer-suites)")
    parser.add_argument("--suite", nargs="+", choices=SUITES, default=list(SUITES))
    parser.add_argument("--lib", type=Path, help="libropejit.so of a build: ropejit is then "
                        "imported from this repository's python/ (else the installed one)")
    parser.add_argument("--out", type=Path, help="write the outcomes, per test, as JSON")
    parser.add_argument("--collect-only", action="store_true",
                        help="only collect the suites (no GPU needed)")
    args, pytest_args = parser.parse_known_args()
    pytest_args = [a for a in pytest_args if a != "--"]
    peers = args.peers.resolve()
    if args.lib:
        args.lib = args.lib.resolve()
        if not args.lib.is_file():
            sys.exit(f"run.py: --lib {args.lib} is not a file")

    summaries = []
    with tempfile.TemporaryDirectory(prefix="ropejit-peer-suites-") as tmp:
        work, site = Path(tmp), Path(tmp) / "site"
        unpack_wheels(peers, site)
        for suite in args.suite:
            if not (peers / suite).is_dir():
                outcome = {"error": f"{peers / suite} is missing: run tools/peer_suites/fetch.sh"}
            else:
                outcome = run_suite(suite, lay_out(peers, suite, work), site, args, pytest_args)
            summaries.append(summarize(suite, peers, outcome))

    print_table(summaries, args.collect_only)
    if args.out:
        commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"],
                                capture_output=True, text=True).stdout.strip()
        report = {"ropejit": {"commit": commit, "lib": str(args.lib or "installed")},
                  "suites": dict(zip(args.suite, summaries))}
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    # Failing tests are results; a suite that did not run or collect is the harness's failure.
    return 1 if any(s.get("error") or s.get("collect_errors") for s in summaries) else 0


if __name__ == "__main__":
    sys.exit(main())
