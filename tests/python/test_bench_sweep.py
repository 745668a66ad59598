"""The shape sweep (bench/sweep.py, bench/sweep_grid.py) and its regression check
(bench/sweep_check.py) without a GPU: the grid holds every pair of axis values under stable
ids, --dry-run lists it without torch, and the check flags what it must on hand-made sweep
JSON."""

import itertools
import json
import subprocess
import sys

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import sweep  # noqa: E402  (bench/ is not a package)
import sweep_check  # noqa: E402
import sweep_grid  # noqa: E402

SWEEP = str(ROOT / "bench" / "sweep.py")
CHECK = str(ROOT / "bench" / "sweep_check.py")


def axis_values(row):
    """The row's value on each axis of sweep_grid.AXES, in its order."""
    rotary = "full" if row.rotary_dim == row.head_dim else "half"
    return (row.dtype, (row.q_heads, row.k_heads), row.head_dim, rotary, row.style,
            row.layout, row.tokens, row.freqs)


# ---- the grid ----

def test_grid_holds_every_pair_of_axis_values():
    seen = set()
    for row in sweep_grid.grid(pinned=False):
        values = axis_values(row)
        seen |= {(a, values[a], b, values[b]) for a, b in itertools.combinations(range(8), 2)}
    axes = list(sweep_grid.AXES.values())
    for a, b in itertools.combinations(range(len(axes)), 2):
        for va, vb in itertools.product(axes[a], axes[b]):
            assert (a, va, b, vb) in seen, f"no row has {va} and {vb}"


def test_grid_is_far_smaller_than_the_product():
    rows = sweep_grid.grid(pinned=False)
    full = sweep_grid.grid(full=True, pinned=False)
    assert len(full) == 3 * 7 * 6 * 2 * 2 * 3 * 6 * 2
    assert 42 <= len(rows) <= 60  # 42: the two largest axes' pairs need one row each


def test_ids_are_unique_stable_and_name_the_row():
    rows = sweep_grid.grid()
    ids = [r.id for r in rows]
    assert len(set(ids)) == len(ids)
    assert ids == [r.id for r in sweep_grid.grid()]
    # Pinned: a changed generator, seed or axis list changes these, and baselines with them.
    assert ids[:3] == ["f32_h128-16_d128_r128_neox_bshd_t16_table",
                       "f16_h128-16_d256_r128_gptj_thd_t256_computed",
                       "bf16_h8-1_d80_r80_gptj_sbhd_t4096_table"]
    assert ids[-len(sweep_grid.PINNED_IDS):] == list(sweep_grid.PINNED_IDS)
    for row in rows:
        assert sweep_grid.row_from_id(row.id) == row
        assert sweep_grid.Row.from_axes(row.axes()) == row


def test_pairwise_rows_fit_the_default_memory_cap():
    assert all(r.device_bytes <= sweep_grid.GRID_MAX_BYTES for r in sweep_grid.grid())
    assert any(r.device_bytes > sweep.DEFAULT_MAX_BYTES for r in sweep_grid.grid(full=True))


def test_pairwise_generator_covers_small_axes_exactly():
    sizes = [3, 2, 2]
    rows = sweep_grid.pairwise_indices(sizes)
    covered = set().union(*(sweep_grid.pairs_of(r) for r in rows))
    assert covered == sweep_grid.all_pairs(sizes)
    assert len(rows) == 6


def test_bytes_moved_counts_as_the_tuner_does():
    row = sweep_grid.row_from_id("bf16_h32-8_d128_r128_neox_bshd_t4096_table")
    # q and k read and written, the f32 half-width cos and sin rows, an int64 id per token.
    assert row.bytes_moved == 4096 * 40 * 128 * 2 * 2 + 4096 * 128 * 4 + 4096 * 8
    partial = sweep_grid.row_from_id("f16_h8-1_d96_r48_gptj_sbhd_t64_computed")
    # In place, partial rotary moves only the rotary part; computed frequencies read no table.
    assert partial.bytes_moved == 64 * 9 * 48 * 2 * 2 + 64 * 8


def test_sequences_follow_the_token_count():
    decode = sweep_grid.row_from_id("bf16_h32-8_d128_r128_neox_sbhd_t256_table")
    prefill = sweep_grid.row_from_id("bf16_h32-8_d128_r128_neox_sbhd_t32768_table")
    assert (decode.batch, decode.seq) == (256, 1)
    assert (prefill.batch, prefill.seq) == (8, 4096)
    odd = sweep_grid.row_from_id("bf16_h32-8_d128_r128_neox_bshd_t5000_table")
    assert (odd.batch, odd.seq) == (1, 5000)


# ---- sweep.py's options and --dry-run ----

def test_axis_options_build_another_grid_and_filters_pick_rows():
    rows = sweep.select_rows(sweep.parse_args(["--dtypes", "bf16", "--tokens", "1,4096"]))
    assert {r.dtype for r in rows} == {"bf16"} and {r.tokens for r in rows} == {1, 4096}
    assert not set(sweep_grid.PINNED_IDS) & {r.id for r in rows}
    picked = sweep.select_rows(sweep.parse_args(["--filter", "_gptj_thd_", "--max-rows", "2"]))
    assert len(picked) == 2 and all("_gptj_thd_" in r.id for r in picked)


def test_axis_options_refuse_unknown_values():
    done = subprocess.run([sys.executable, SWEEP, "--dry-run", "--dtypes", "fp16"],
                          capture_output=True, text=True)
    assert done.returncode == 1
    assert "--dtypes fp16: 'fp16' is not one of f32, f16, bf16" in done.stderr


def test_dry_run_lists_the_grid():
    out = subprocess.run([sys.executable, SWEEP, "--dry-run"], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    rows = sweep_grid.grid()
    assert out[0].startswith(f"# {len(rows)} rows")
    assert [line.split()[0] for line in out[1:]] == [r.id for r in rows]
    assert "86.02 MB" in next(line for line in out if line.startswith(
        "bf16_h32-8_d128_r128_neox_bshd_t4096_table"))


def test_dry_run_says_which_rows_it_skips():
    out = subprocess.run([sys.executable, SWEEP, "--dry-run", "--filter", "t32768",
                          "--max-bytes", "64M"], capture_output=True, text=True,
                         check=True).stdout
    assert "skipped: needs" in out and "over --max-bytes 0.1 GiB" in out


def test_dry_run_imports_neither_torch_nor_ropejit():
    code = ("import runpy, sys; sys.argv = ['sweep.py', '--dry-run', '--full']; "
            f"runpy.run_path({SWEEP!r}, run_name='__main__'); "
            "assert 'torch' not in sys.modules and 'ropejit' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


# ---- sweep_check.py ----

SMALL = "bf16_h32-8_d128_r128_neox_bshd_t16_table"
BIG = "bf16_h32-8_d128_r128_neox_bshd_t32768_table"


def row(row_id, us, copy_us=None, nbytes=1_000_000, peers=None, **fields):
    copy_us = us if copy_us is None else copy_us
    out = {"id": row_id, "family": "rope", "bytes": nbytes, "status": "ok", "check_ok": True,
           "ropejit_us": us, "copy_us": copy_us, "pct_copy": 100.0 * copy_us / us}
    if peers:
        out["peers"] = peers
    out.update(fields)
    return out


def write_run(path, rows, gpu="NVIDIA H200"):
    run = {"format": sweep.SWEEP_FORMAT,
           "header": {"gpu": gpu, "date": "2026-12-01T00:00:00+00:00", "ropejit": "0.0"},
           "rows": rows}
    path.write_text(json.dumps(run))
    return str(path)


def check(tmp_path, new_rows, base_rows, *extra):
    new = write_run(tmp_path / "new.json", new_rows)
    base = write_run(tmp_path / "base.json", base_rows)
    return sweep_check.main([new, "--baseline", base, *extra])


@pytest.mark.parametrize("slowdown, flagged", [(1.06, True), (1.04, False)])
def test_check_flags_a_slowdown_beyond_five_percent(tmp_path, capsys, slowdown, flagged):
    status = check(tmp_path, [row(SMALL, 10.0 * slowdown, copy_us=10.0)], [row(SMALL, 10.0)])
    out = capsys.readouterr().out
    assert status == (1 if flagged else 0)
    assert (f"{SMALL}: {10.0 * slowdown:.2f} µs against 10.00 µs" in out) == flagged


def test_check_tolerance_option(tmp_path, capsys):
    assert sweep_check.MAX_SLOWDOWN_PCT == 5.0
    assert check(tmp_path, [row(SMALL, 10.6)], [row(SMALL, 10.0)], "--tolerance", "7") == 0


def test_check_flags_a_tuned_slowdown(tmp_path, capsys):
    new = row(SMALL, 10.0, tuned={"ropejit_us": 11.0})
    base = row(SMALL, 10.0, tuned={"ropejit_us": 10.0})
    assert check(tmp_path, [new], [base]) == 1
    assert "tuned 11.00 µs against 10.00 µs" in capsys.readouterr().out


def test_check_flags_a_large_row_below_the_copy_target(tmp_path, capsys):
    rows = [row(BIG, 100.0, copy_us=90.0, nbytes=688_000_000),    # 90%: flagged
            row("big_ok", 100.0, copy_us=96.0, nbytes=688_000_000),  # 96%
            row(SMALL, 100.0, copy_us=50.0, nbytes=63_999_999)]  # under 64 MB: no target
    assert check(tmp_path, rows, rows) == 1
    out = capsys.readouterr().out
    assert f"{BIG}: 90.0% of copy" in out
    assert "big_ok:" not in out and f"{SMALL}:" not in out


def test_check_names_the_pattern_copy_of_a_partial_row_and_still_flags_it(tmp_path, capsys):
    partial = "bf16_h128-16_d80_r40_gptj_sbhd_t32768_table"
    rows = [row(partial, 100.0, copy_us=60.0, nbytes=760_000_000, pattern_copy_us=180.0,
                pattern_copy_by="torch", pct_pattern_copy=180.0)]
    assert check(tmp_path, rows, rows) == 1
    out = capsys.readouterr().out
    assert (f"{partial}: 60.0% of copy (100.00 µs, copy 60.00 µs; the pattern's copy (torch) "
            f"180.00 µs, 760.0 MB)") in out


def test_check_flags_a_peer_ahead_by_more_than_one_percent(tmp_path, capsys):
    ahead = {"liger": {"us": 9.8, "check_ok": True}}          # ropejit 2% behind
    close = {"torch.compile": {"us": 9.95, "check_ok": True}}  # 0.5% behind
    wrong = {"liger": {"us": 5.0, "check_ok": False}}          # failed its check
    rows = [row(SMALL, 10.0, peers=ahead), row("close", 10.0, peers=close),
            row("wrong_peer", 10.0, peers=wrong)]
    assert check(tmp_path, rows, rows) == 1
    out = capsys.readouterr().out
    assert f"{SMALL}: 10.00 µs against liger 9.80 µs" in out
    assert "close:" not in out and "wrong_peer:" not in out


def test_check_flags_rows_where_ropejit_failed(tmp_path, capsys):
    failed = {"id": SMALL, "status": "wrong", "rel_l2": 0.5, "check_ok": False, "bytes": 1}
    assert check(tmp_path, [failed], [row(SMALL, 10.0)]) == 1
    assert f"{SMALL}: wrong" in capsys.readouterr().out


def test_check_lists_missing_rows_without_failing(tmp_path, capsys):
    skipped = {"id": "skipped_row", "status": "skipped", "reason": "too big", "bytes": 1}
    status = check(tmp_path, [row(SMALL, 10.0), row("only_new", 5.0), skipped],
                   [row(SMALL, 10.0), row("only_base", 5.0), row("skipped_row", 5.0)])
    out = capsys.readouterr().out
    assert status == 0
    assert "not in the baseline (1): only_new" in out
    assert "not in this run (1): only_base" in out
    assert "untimed on one side (1): skipped_row" in out


def test_check_without_a_baseline_exits_2(tmp_path):
    new = write_run(tmp_path / "new.json", [row(SMALL, 10.0)], gpu="NVIDIA H200")
    done = subprocess.run([sys.executable, CHECK, new, "--baseline-dir", str(tmp_path / "none")],
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert "no baseline for h200: record one with" in done.stdout
    assert "sweep_h200.json" in done.stdout


def test_check_finds_the_baseline_of_the_run_gpu(tmp_path, capsys):
    new = write_run(tmp_path / "new.json", [row(SMALL, 11.0)], gpu="NVIDIA H100 80GB HBM3")
    write_run(tmp_path / "sweep_h100.json", [row(SMALL, 10.0)], gpu="NVIDIA H100 80GB HBM3")
    assert sweep_check.main([new, "--baseline-dir", str(tmp_path)]) == 1
    assert "sweep_h100.json" in capsys.readouterr().out


@pytest.mark.parametrize("name, kind", [("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"),
                                        ("NVIDIA A100-SXM4-80GB", "a100"),
                                        ("NVIDIA GH200 480GB", "gh200"), ("NVIDIA B200", "b200")])
def test_gpu_kind(name, kind):
    assert sweep_check.gpu_kind(name) == kind


# ---- one row's measurement, with ropejit's host emulator in place of the GPU ----

EMULATED_IDS = ("bf16_h8-1_d64_r64_neox_bshd_t16_table",
                "f16_h4-2_d96_r48_gptj_sbhd_t600_table",
                "f32_h3-1_d80_r40_neox_thd_t16_computed",
                "bf16_h2-2_d64_r64_gptj_bshd_t300_computed",
                "f16_h2-1_d128_r128_neox_sbhd_t300_computed",
                "f32_h5-1_d192_r96_gptj_thd_t450_table")


@pytest.fixture
def emulated_measure(monkeypatch):
    """sweep_measure on CPU tensors, ropejit's launches run by the float64 host emulator, the
    timers replaced by constants, torch.compile by the eager function; sequences of 150
    tokens, so that prefill rows hold several."""
    torch = pytest.importorskip("torch")
    from conftest import Backend, _emulate

    import sweep_measure

    def time_us(fn, *timing):
        fn()
        return 2.0

    _emulate(monkeypatch, Backend("emulated"))
    monkeypatch.setattr(sweep_grid, "PREFILL_SEQ", 150)
    monkeypatch.setattr(sweep_measure, "DEVICE", "cpu")
    monkeypatch.setattr(sweep_measure, "time_us", time_us)
    monkeypatch.setattr(sweep_measure, "time_copy", lambda *args: 1.0)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)
    monkeypatch.setitem(sys.modules, "liger_kernel", None)  # a peer that is not installed
    return sweep_measure


@pytest.mark.long
@pytest.mark.parametrize("row_id", EMULATED_IDS)
def test_measured_row_passes_its_float64_check(emulated_measure, row_id):
    import ropejit
    row = sweep_grid.row_from_id(row_id)
    assert row.batch * row.seq == row.tokens and (row.tokens <= 256 or row.batch > 1)
    out = emulated_measure.measure_row(ropejit, row, (None, 0, 1), peers=True)
    assert out["status"] == "ok", out
    assert out["rel_l2"] < emulated_measure.TOLERANCE[row.dtype]
    assert (out["ropejit_us"], out["copy_us"], out["pct_copy"]) == (2.0, 1.0, 50.0)
    assert out["key"].startswith(f"rope_{row.layout}_{row.dtype}_d{row.head_dim}")
    if row.rotary_dim < row.head_dim:  # timed against a copy of the same pieces too
        assert out["pattern_copy_us"] == 2.0 and out["pct_pattern_copy"] == 100.0
        assert "pattern_copy_driver_error" in out  # no driver on the CPU
    else:
        assert "pattern_copy_us" not in out
    compiled = out["peers"]["torch.compile"]
    assert compiled["check_ok"], compiled  # the HF formula, on the same tensors
    assert set(out["peers"]["liger"]) & {"error", "unsupported"}


def test_a_wrong_result_is_reported_not_timed(emulated_measure, monkeypatch):
    import ropejit
    row = sweep_grid.row_from_id(EMULATED_IDS[0])
    monkeypatch.setattr(emulated_measure, "ropejit_call", lambda *args: lambda q, k: (q, k))
    out = emulated_measure.measure_row(ropejit, row, (None, 0, 1), peers=False)
    assert out["status"] == "wrong" and out["ropejit_us"] is None and not out["check_ok"]


def test_the_pattern_copy_moves_the_rotary_part_of_every_head(emulated_measure):
    import types

    import torch
    row = sweep_grid.row_from_id("f32_h5-1_d192_r96_gptj_thd_t450_table")
    x = types.SimpleNamespace(q0=torch.randn(row.tokens, 5, 192), k0=torch.randn(row.tokens, 1, 192))
    pieces = emulated_measure.pattern_pieces(row, x)
    for (src, dst), heads in zip(pieces, (5, 1)):
        assert src.shape == dst.shape == (row.tokens * heads, 96)
        assert src.stride() == dst.stride() == (192, 1)
        dst.copy_(src)
        assert torch.equal(dst, src)
