#!/usr/bin/env python3
"""Where NVRTC spends a cold compile: front end, NVVM optimizer, PTX -> SASS, per option set.

Compiles the source `ropejit source KEY` renders (headers from templates/) through libnvrtc
with ropejit's options plus each extra option set, REPS times, every source made unique by an
appended empty kernel (NVRTC's cache keys on the PTX), and prints the fastest time of each phase
(NVRTC's --time report) and of the whole call. An empty kernel is the floor.

    python3 bench/compile_phases.py --ropejit build/ropejit --reps 5 --source bench/minimal_rope.cu \
        --extra "" --extra "--Ofast-compile=min" --extra "-Xptxas=-O1"

--trace also prints the stages inside those phases for each source (NVRTC's
--fdevice-time-trace: headers, template instantiation, NVVM's module linker, ptxas set-up and
optimization), from one more compile.
"""
import argparse
import ctypes
import ctypes.util
import os
import json
import subprocess
import tempfile
import time

KEYS = ["rope_bshd_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_qk_fwd_ip",
        "rope_bshd_bf16_d128_r128_neox_pos-ids-i64_comp_qk_fwd_ip"]
BASE = ["--gpu-architecture=sm_90", "--std=c++17", "--fmad=true", "-lineinfo",
        "--device-as-default-execution-space", "-minimal"]
EMPTY = 'extern "C" __global__ void k() {}\n'


def load_nvrtc(path):
    for cand in [path, ctypes.util.find_library("nvrtc"), "/usr/local/cuda/lib64/libnvrtc.so",
                 "libnvrtc.so.13", "libnvrtc.so.12"]:
        if not cand:
            continue
        try:
            return ctypes.CDLL(cand)
        except OSError:
            pass
    raise SystemExit("libnvrtc not found; pass --nvrtc PATH")


def compile_once(nv, source, options):
    prog = ctypes.c_void_p()
    if nv.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"k.cu", 0, None, None):
        raise SystemExit("nvrtcCreateProgram failed")
    opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
    t0 = time.perf_counter()
    rc = nv.nvrtcCompileProgram(prog, len(options), opts)
    wall = (time.perf_counter() - t0) * 1e3
    size = ctypes.c_size_t()
    nv.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nv.nvrtcGetProgramLog(prog, log)
    nv.nvrtcDestroyProgram(ctypes.byref(prog))
    if rc:
        raise SystemExit(f"compile failed ({rc}): {log.value.decode(errors='replace')[:2000]}")
    phases = {}
    for line in log.value.decode(errors="replace").splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) >= 4 and cols[-1] == "ms":
            phases[cols[1]] = phases.get(cols[1], 0.0) + float(cols[2])
    return wall, phases


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ropejit", default="build/ropejit")
    ap.add_argument("--templates", default=os.path.join(os.path.dirname(__file__), "..", "templates"))
    ap.add_argument("--nvrtc", default=None)
    ap.add_argument("--key", action="append", default=None)
    ap.add_argument("--source", action="append", default=None,
                    help="a CUDA file to time as well (bench/minimal_rope.cu: the floor of a real kernel)")
    ap.add_argument("--extra", action="append", default=None, help="extra option set (repeatable)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--trace", action="store_true", help="print each source's compile stages")
    a = ap.parse_args()
    nv = load_nvrtc(a.nvrtc)
    compile_once(nv, EMPTY, BASE)  # NVRTC start-up, not counted
    sources = [("empty kernel", EMPTY)]
    for key in a.key or KEYS:
        src = subprocess.run([a.ropejit, "source", key], check=True, capture_output=True, text=True).stdout
        sources.append((key, src))
    for path in a.source or []:
        with open(path) as f:
            sources.append((os.path.basename(path), f.read()))
    salt = 0
    print(f"{'source':66s} {'extra options':24s} {'wall':>7s}  phases (fastest of {a.reps}, ms)")
    for extra in a.extra or [""]:
        for name, src in sources:
            best_wall, best = float("inf"), {}
            for _ in range(a.reps):
                salt += 1
                unique = src + f'\nextern "C" __global__ void ropejit_phase_{os.getpid()}_{salt}() {{}}\n'
                wall, phases = compile_once(nv, unique, BASE + ["-I" + a.templates, "--time=-"] + extra.split())
                best_wall = min(best_wall, wall)
                for k, v in phases.items():
                    best[k] = min(best.get(k, v), v)
            detail = "  ".join(f"{k}={v:.0f}" for k, v in best.items())
            print(f"{name:66s} {extra or '(none)':24s} {best_wall:7.1f}  {detail}")
    if a.trace:
        for name, src in sources:
            salt += 1
            unique = src + f'\nextern "C" __global__ void ropejit_phase_{os.getpid()}_{salt}() {{}}\n'
            print(f"stages of {name}: {trace_stages(nv, unique, BASE + ['-I' + a.templates])}")


# The stages (ms) of one compile, from NVRTC's Chrome-trace output. Nested events of the same
# name (a header included by a header) count once; the NVVM optimizer is its "Phase I".
STAGES = [("Processing Header File", "headers"), ("Instantiating Template Function", "templates"),
          ("NVVM Module Linker", "nvvm-link"), ("Phase I", "nvvm-opt"), ("NVVM CodeGen", "nvvm-codegen"),
          ("PTX parsing and setup time", "ptxas-setup"), ("Optimizing compilation unit", "ptxas-opt"),
          ("Post processing", "ptxas-post")]


def trace_stages(nv, source, options):
    with tempfile.TemporaryDirectory() as d:
        compile_once(nv, source, options + [f"--fdevice-time-trace={os.path.join(d, 'trace')}"])
        with open(os.path.join(d, os.listdir(d)[0])) as f:
            events = json.load(f)
    events = events["traceEvents"] if isinstance(events, dict) else events
    parts = []
    for name, label in STAGES:
        spans = sorted((e["ts"], e["ts"] + e.get("dur", 0)) for e in events
                       if e.get("ph") == "X" and e.get("name") == name)
        total, end = 0.0, float("-inf")
        for t0, t1 in spans:
            if t0 >= end:  # not inside the previous outermost span
                total += t1 - t0
                end = t1
        if spans:
            parts.append(f"{label}={total / 1e3:.1f}")
    return "  ".join(parts)


if __name__ == "__main__":
    main()
