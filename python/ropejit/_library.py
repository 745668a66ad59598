"""The library-level entry points that need no tensors: the kernel key of a spec, precompiling
into the disk cache (no GPU needed), and `info()` (what `ropejit info` prints)."""

import ctypes
import dataclasses
import os
import subprocess

from ropejit import _capi
from ropejit._cvalues import choice, fill, shown
from ropejit.errors import InvalidArgument


@dataclasses.dataclass(frozen=True)
class Spec:
    """The plain-RoPE axes of a kernel (ropejit::Spec); values are the names keys use.
    rotary_dim 0 means head_dim. positions: offset, seq_offsets, ids, mrope (three rows of ids);
    freqs: table, computed, or a scaled variant computed in the kernel (linear, dynamic_ntk,
    llama3, yarn, longrope). (The fused axes, QK-norm, FP8 outputs and the KV cache, are not
    part of it: ropejit.fused.qk_norm_rope derives them from its arguments.)"""

    layout: str = "bshd"
    dtype: str = "bf16"
    head_dim: int = 128
    rotary_dim: int = 0
    style: str = "neox"
    positions: str = "offset"
    index_type: str = "i64"
    freqs: str = "table"
    table_dtype: str = "f32"
    table_width: str = "half"
    direction: str = "forward"
    in_place: bool = True

    _CHOICES = {"layout": _capi.LAYOUTS, "dtype": _capi.DTYPES, "style": _capi.STYLES,
                "positions": _capi.POSITIONS, "index_type": _capi.INDEX_TYPES,
                "freqs": _capi.FREQS, "table_dtype": _capi.DTYPES,
                "table_width": _capi.TABLE_WIDTHS, "direction": _capi.DIRECTIONS}

    def to_c(self):
        """The ropejit_spec; InvalidArgument for a value that names nothing (the library
        checks the combinations)."""
        s = _capi.default_spec()
        for field, choices in self._CHOICES.items():
            setattr(s, field, choice(f"spec.{field}", getattr(self, field), choices))
        return fill(s, "spec.", head_dim=self.head_dim, rotary_dim=self.rotary_dim,
                    in_place=self.in_place)


def _as_spec(spec, fields):
    if spec is None:
        spec = Spec()
    if not isinstance(spec, Spec):
        raise InvalidArgument(f"ropejit: spec ({spec!r}) must be a ropejit.Spec")
    unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(Spec)})
    if unknown:
        raise InvalidArgument(f"ropejit: {unknown[0]!r} is not a field of ropejit.Spec")
    return dataclasses.replace(spec, **fields) if fields else spec


def key(spec=None, **fields):
    """The canonical kernel key (rope_bshd_bf16_d128_r128_neox_pos-offset_tab-f32-half_qk_fwd_ip
    for the defaults): the name of the kernel, its cache file, its tuning entry.
    key(Spec(...)), key(dtype="f16") or key(spec, head_dim=64)."""
    c = _as_spec(spec, fields).to_c()
    buf = ctypes.create_string_buffer(_capi.KEY_BUFFER)
    _capi.check(_capi.lib.ropejit_key(ctypes.byref(c), buf, len(buf)))
    return buf.value.decode()


def precompile(spec=None, arch="sm_90", **fields):
    """Compiles the spec's default kernels (prefill's and decode's) for `arch` into the disk
    cache, so that the first call loads instead of compiling; needs no GPU."""
    c = _as_spec(spec, fields).to_c()
    # ASCII without NUL: C would read a NUL-holding string only up to its NUL.
    if not isinstance(arch, str) or not arch.isascii() or "\0" in arch:
        raise InvalidArgument(f"ropejit: arch ({shown(arch)}) must be a string such as 'sm_90'")
    _capi.check(_capi.lib.ropejit_precompile(ctypes.byref(c), arch.encode()))


def command_path():
    """The `ropejit` command installed with this package."""
    from _ropejit_cli import command_path as in_package  # the console script's definition

    return in_package(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass(frozen=True)
class CacheCounts:
    """What this process's kernel cache has done so far, over every key family: kernels
    compiled with NVRTC, loaded from the disk cache, found in memory, and modules loaded onto a
    device. A warm start (every kernel in the disk cache) compiles nothing."""

    compiled: int
    disk_hits: int
    memory_hits: int
    module_loads: int


def cache_counts():
    """The process's CacheCounts so far (ropejit_cache_counts)."""
    counts = [ctypes.c_uint64() for _ in range(4)]
    _capi.lib.ropejit_cache_counts(*(ctypes.byref(c) for c in counts))
    return CacheCounts(*(c.value for c in counts))


@dataclasses.dataclass(frozen=True)
class Info:
    """What `ropejit info` reports, plus where this package's files are."""

    version: str
    library: str
    command: str
    nvrtc: str
    driver: str  # "CUDA 13.0", or "none: WHY"
    gpus: tuple  # "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs)", ...
    cache_dir: str  # "" when caching is memory-only
    cache_status: str  # "ok", or why the disk cache is off
    cache_files: int


def info():
    """Versions, GPUs and the kernel cache, as the bundled `ropejit info` prints them (it runs
    in a subprocess, so a driver failing to load cannot disturb this process)."""
    command = command_path()
    out = subprocess.run([command, "info"], check=True, capture_output=True, text=True).stdout
    fields = {"gpu": []}
    for line in out.splitlines():
        name, _, value = line.partition(" ")
        if line.startswith("cache dir"):
            name, value = "cache_dir", line[len("cache dir"):]
        elif line.startswith("cache files"):
            name, value = "cache_files", line[len("cache files"):]
        value = value.strip()
        if name == "gpu":
            fields["gpu"].append(value)
        else:
            fields[name] = value
    # "cache dir    PATH (STATUS)", PATH "-" when caching is memory-only.
    cache_dir, _, status = fields.get("cache_dir", "").rpartition(" (")
    return Info(version=_capi.version(), library=_capi.lib._name, command=command,
                nvrtc=fields.get("nvrtc", ""), driver=fields.get("driver", ""),
                gpus=tuple(fields["gpu"]), cache_dir="" if cache_dir == "-" else cache_dir,
                cache_status=status.rstrip(")"), cache_files=int(fields.get("cache_files") or 0))
