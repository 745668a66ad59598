"""The installed package without a GPU: where it was imported from, versions, the command,
keys, precompiling, the C structs against the C header, errors, and the no-driver error."""

import ctypes
import importlib.metadata
import json
import os
import pathlib
import pickle
import shutil
import subprocess
import sys
import sysconfig

import pytest
from conftest import FAKE_PTR, ROOT, CudaArray, header_version, no_driver

import ropejit
from ropejit import _capi, errors


def test_imported_from_the_installed_package():
    # The tests check what `pip install .` installed, not the source tree.
    package = pathlib.Path(ropejit.__file__).resolve().parent
    site = {pathlib.Path(sysconfig.get_paths()[k]).resolve() for k in ("purelib", "platlib")}
    assert package.parent in site, f"ropejit imported from {package}, not from {site}"
    assert (package / "libropejit.so").is_file()
    assert pathlib.Path(_capi.lib._name).resolve() == package / "libropejit.so"


def test_versions_agree():
    assert ropejit.__version__ == header_version()
    assert importlib.metadata.version("ropejit") == header_version()


def test_library_does_not_link_libcuda():
    # The driver is dlopened on first use: importing must work on machines without one.
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("readelf is not installed")
    needed = subprocess.run([readelf, "-d", _capi.lib._name], check=True, capture_output=True,
                            text=True).stdout
    assert "libcuda" not in needed
    assert "libnvrtc" in needed


def run_module(*args):
    return subprocess.run([sys.executable, "-m", "ropejit", *args], capture_output=True,
                          text=True, timeout=300)


def test_python_m_ropejit_info():
    r = run_module("info")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"ropejit {header_version()}\n")
    for label in ("nvrtc", "driver", "cache dir", "cache files"):
        assert f"\n{label} " in r.stdout


def test_console_script_and_exit_codes():
    script = pathlib.Path(sysconfig.get_paths()["scripts"]) / "ropejit"
    assert script.is_file(), f"{script} was not installed"
    r = subprocess.run([str(script), "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and header_version() in r.stdout
    # The script does not import the package (whose import loads the library): with the
    # library pointed at nothing, the command still runs.
    env = dict(os.environ, ROPEJIT_LIB="/nonexistent/libropejit.so")
    r = subprocess.run([str(script), "--version"], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and header_version() in r.stdout, r.stderr
    r = run_module("no-such-command")
    assert r.returncode == 2
    assert "unknown command 'no-such-command'" in r.stderr


def test_info_fields():
    i = ropejit.info()
    assert i.version == header_version()
    assert i.nvrtc.count(".") == 1
    assert os.path.isfile(i.library) and os.access(i.command, os.X_OK)
    assert i.driver.startswith("CUDA ") or i.driver.startswith("none: ")
    if i.driver.startswith("none"):
        assert i.gpus == ()
    assert i.cache_files >= 0


def test_key_defaults_and_fields():
    assert ropejit.key() == "rope_bshd_bf16_d128_r128_neox_pos-offset_tab-f32-half_qk_fwd_ip"
    spec = ropejit.Spec(layout="thd", dtype="f16", head_dim=80, rotary_dim=32, style="gptj",
                        positions="ids", index_type="i32", freqs="computed",
                        direction="backward", in_place=False)
    assert ropejit.key(spec) == "rope_thd_f16_d80_r32_gptj_pos-ids-i32_comp_qk_bwd_oop"
    assert ropejit.key(spec, head_dim=64) == "rope_thd_f16_d64_r32_gptj_pos-ids-i32_comp_qk_bwd_oop"


def test_key_of_scaled_frequencies_and_mrope():
    # The scaled variants are computed in the kernel: their parameters are call arguments, so
    # the key names only the variant.
    assert ropejit.key(freqs="llama3", positions="ids") == (
        "rope_bshd_bf16_d128_r128_neox_pos-ids-i64_comp-llama3_qk_fwd_ip")
    assert ropejit.key(freqs="yarn", positions="mrope", index_type="i32") == (
        "rope_bshd_bf16_d128_r128_neox_pos-mrope-i32_comp-yarn_qk_fwd_ip")


@pytest.mark.parametrize("fields, words", [
    (dict(head_dim=63), ["head_dim", "63"]),
    (dict(rotary_dim=130), ["rotary_dim", "130"]),
    (dict(layout="bsdh"), ["spec.layout", "'bsdh'", "'bshd'"]),
    (dict(positions="mrope3"), ["spec.positions", "'mrope3'", "'mrope'"]),
    (dict(freqs="llama4"), ["spec.freqs", "'llama4'", "'longrope'"]),
    (dict(head_dim="128"), ["spec.head_dim", "'128'"]),
    (dict(head_dims=64), ["'head_dims' is not a field of ropejit.Spec"]),
])
def test_key_rejects_bad_specs(fields, words):
    with pytest.raises(ropejit.InvalidArgument) as e:
        ropejit.key(**fields)
    assert e.value.code == ropejit.ErrorCode.invalid_argument
    for word in words:
        assert word in str(e.value)


def test_key_needs_a_spec():
    with pytest.raises(ropejit.InvalidArgument, match=r"spec \('rope_bshd'\) must be a "
                                                      r"ropejit.Spec"):
        ropejit.key("rope_bshd")


def test_precompile_fills_the_disk_cache(tmp_path):
    # In a subprocess: the library reads ROPEJIT_CACHE_DIR once per process.
    code = ("import ropejit; ropejit.precompile(ropejit.Spec(dtype='f16', head_dim=64), "
            "arch='sm_80')")
    env = dict(os.environ, ROPEJIT_CACHE_DIR=str(tmp_path / "cache"), ROPEJIT_QUIET="1")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    entries = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert len(entries) >= 2, entries  # prefill's and decode's kernels


def test_cache_counts_say_what_was_compiled_and_what_was_loaded(tmp_path):
    # A cold process compiles every kernel; the next one, on the same directory, loads them all.
    code = ("import json, ropejit; before = ropejit.cache_counts(); "
            "ropejit.precompile(ropejit.Spec(dtype='f16', head_dim=64), arch='sm_80'); "
            "print(json.dumps([vars(before), vars(ropejit.cache_counts())]))")
    env = dict(os.environ, ROPEJIT_CACHE_DIR=str(tmp_path / "cache"), ROPEJIT_QUIET="1")
    runs = []
    for _ in range(2):
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        runs.append(json.loads(r.stdout))
    entries = len([p for p in (tmp_path / "cache").rglob("*.rjk")])
    zero = dict(compiled=0, disk_hits=0, memory_hits=0, module_loads=0)
    assert runs[0][0] == zero and runs[1][0] == zero
    assert runs[0][1] == dict(zero, compiled=entries), runs
    assert runs[1][1] == dict(zero, disk_hits=entries), runs
    assert entries >= 2
    assert isinstance(ropejit.cache_counts(), ropejit.CacheCounts)


def test_precompile_rejects_a_bad_arch():
    with pytest.raises(ropejit.InvalidArgument, match="sm_1x"):
        ropejit.precompile(arch="sm_1x")
    with pytest.raises(ropejit.InvalidArgument, match="arch"):
        ropejit.precompile(arch=90)


# Every field of the C structs, as offsetof() in a C compiler sees them.
_STRUCTS = {"ropejit_spec": _capi.ropejit_spec, "ropejit_tensor": _capi.ropejit_tensor,
            "ropejit_scaling": _capi.ropejit_scaling, "ropejit_kv_cache": _capi.ropejit_kv_cache,
            "ropejit_args": _capi.ropejit_args, "ropejit_model": _capi.ropejit_model,
            "ropejit_qkv_proj_spec": _capi.ropejit_qkv_proj_spec,
            "ropejit_qkv_proj_args": _capi.ropejit_qkv_proj_args,
            "ropejit_ffn_spec": _capi.ropejit_ffn_spec, "ropejit_ffn_args": _capi.ropejit_ffn_args}


def test_structs_match_the_c_header(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to read the header's layout")
    lines = ["#include <stddef.h>", "#include <stdio.h>", '#include "ropejit/ropejit.h"',
             "int main(void) {"]
    for name, cls in _STRUCTS.items():
        lines.append(f'printf("{name} size %zu\\n", sizeof({name}));')
        for field, _ in cls._fields_:
            lines.append(f'printf("{name} {field} %zu\\n", offsetof({name}, {field}));')
    lines.append("return 0; }")
    (tmp_path / "layout.c").write_text("\n".join(lines))
    subprocess.run([cc, "-I", str(ROOT / "include"), str(tmp_path / "layout.c"), "-o",
                    str(tmp_path / "layout")], check=True)
    printed = subprocess.run([str(tmp_path / "layout")], check=True, capture_output=True,
                             text=True).stdout.split("\n")
    ours = []
    for name, cls in _STRUCTS.items():
        ours.append(f"{name} size {ctypes.sizeof(cls)}")
        ours += [f"{name} {field} {getattr(cls, field).offset}" for field, _ in cls._fields_]
    assert printed[:-1] == ours


def test_struct_size_mismatch_is_an_import_error():
    class Library:
        _name = "/elsewhere/libropejit.so"

        def ropejit_struct_sizes(self, spec, args):
            spec._obj.value, args._obj.value = 64, 400

    with pytest.raises(ImportError) as e:
        _capi.check_struct_sizes(Library())
    message = str(e.value)
    assert "sizeof(ropejit_spec) 64" in message and "sizeof(ropejit_args) 400" in message
    assert f"{ctypes.sizeof(_capi.ropejit_spec)} and {ctypes.sizeof(_capi.ropejit_args)}" in message
    assert "/elsewhere/libropejit.so" in message

    class Decode(Library):
        def ropejit_struct_sizes(self, spec, args):
            spec._obj.value = ctypes.sizeof(_capi.ropejit_spec)
            args._obj.value = ctypes.sizeof(_capi.ropejit_args)

        def ropejit_decode_struct_sizes(self, *sizes):
            for s in sizes:
                s._obj.value = 8

    with pytest.raises(ImportError, match="decode-block structs have sizes"):
        _capi.check_struct_sizes(Decode())


def test_error_classes_carry_code_and_message():
    e = errors.from_status(3, "ropejit: no driver")
    assert isinstance(e, ropejit.NoDriverError) and isinstance(e, ropejit.Error)
    assert isinstance(e, RuntimeError)
    assert e.code == ropejit.ErrorCode.no_driver and e.message == "ropejit: no driver"
    assert isinstance(errors.from_status(1, "x"), ValueError)
    assert type(errors.from_status(2, "x")) is ropejit.CompileError
    unknown = errors.from_status(42, "x")
    assert type(unknown) is ropejit.InternalError and "42" in str(unknown)
    again = pickle.loads(pickle.dumps(e))
    assert type(again) is ropejit.NoDriverError and again.code == e.code
    assert again.message == e.message


def test_without_a_driver_a_valid_call_fails_with_no_driver():
    if not no_driver():
        pytest.skip("a CUDA driver is present: this test would launch on fake pointers")
    q = CudaArray((1, 4, 2, 64))
    k = CudaArray((1, 4, 1, 64), ptr=FAKE_PTR + (1 << 20))
    with pytest.raises(ropejit.NoDriverError) as e:
        ropejit.apply(q, k, base=10000.0)
    assert e.value.code == ropejit.ErrorCode.no_driver
    assert "libcuda.so.1" in e.value.message


def test_qkv_projection_key_and_errors():
    from ropejit import decode
    assert decode.qkv_projection_key() == "qkvproj_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_nrms"
    assert (decode.qkv_projection_key(dtype="f16", head_dim=64, rotary_dim=32, style="gptj",
                                      positions="offset", freqs="computed", norm="rms_one_plus")
            == "qkvproj_f16_d64_r32_gptj_pos-offset_comp_nrms1p")
    with pytest.raises(ropejit.InvalidArgument, match=r"spec.head_dim \(72\)"):
        decode.qkv_projection_key(head_dim=72)
    assert (decode.qkv_projection_key(weights="e4m3")
            == "qkvproj_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_nrms_we4m3")
    assert (decode.qkv_projection_key(cache="slots", cache_store="e4m3")
            == "qkvproj_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_nrms_cslots-e4m3")
    assert decode.qkv_projection_key(cache="paged").endswith("_nrms_cpaged")
    # A dynamic FP8 cache: keys without a fused kernel (the unfused path computes the scales),
    # placing tokens in a paged or contiguous cache by position ids.
    assert (decode.qkv_projection_key(cache="paged", cache_store="e4m3_dynamic")
            == "qkvproj_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_nrms_cpaged-e4m3dyn")
    with pytest.raises(ropejit.InvalidArgument, match=r"spec.cache_store \(e4m3dyn\) with a "
                                                      r"paged cache needs spec.positions ids"):
        decode.qkv_projection_key(cache="paged", cache_store="e4m3_dynamic", positions="offset")


def test_ffn_key_and_errors():
    from ropejit import decode
    assert decode.ffn_key() == "ffnglu_bf16_nrms_silu"
    assert decode.ffn_key(dtype="f16", norm="rms_one_plus", act="gelu_tanh") == \
        "ffnglu_f16_nrms1p_gelutanh"
    assert decode.ffn_key(weights="e4m3") == "ffnglu_bf16_nrms_silu_we4m3"
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    x = torch.zeros(2, 64, dtype=torch.bfloat16)
    w = torch.zeros(2 * 32, 64, dtype=torch.bfloat16)
    with pytest.raises(ropejit.InvalidArgument, match="runs on a CUDA device"):
        decode.ffn_gate_up(x, w, norm="none")
    with pytest.raises(ropejit.InvalidArgument, match=r"act \('relu'\) must be one of"):
        decode.ffn_gate_up(x, w, act="relu")
    with pytest.raises(ropejit.InvalidArgument, match="not both"):
        decode.ffn_gate_up(x, w, gate_weight=w[:32], up_weight=w[32:])
    with pytest.raises(ropejit.InvalidArgument, match="go together"):
        decode.ffn_gate_up(x, gate_weight=w[:32])


def test_qkv_projection_refuses_bad_tensors_before_the_gpu():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    from ropejit import decode
    x = torch.zeros(2, 64, dtype=torch.bfloat16)
    w = torch.zeros((4 + 2 * 2) * 16, 64, dtype=torch.bfloat16)
    with pytest.raises(ropejit.InvalidArgument, match="runs on a CUDA device"):
        decode.qkv_projection(x, w, q_heads=4, kv_heads=2, head_dim=16, norm="none")
    with pytest.raises(ropejit.InvalidArgument, match=r"path \('fast'\) must be one of"):
        decode.qkv_projection(x, w, q_heads=4, kv_heads=2, head_dim=16, norm="none", path="fast")
