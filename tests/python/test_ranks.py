"""Tensor-parallel ranks on one host (two GPUs; skipped, visibly, with fewer): two processes
started together by torchrun on one empty kernel cache compile each kernel once between them,
the other rank loading what the first published, and compute the same bits."""

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                 reason="needs two CUDA GPUs (tensor-parallel ranks)")]


def test_two_ranks_share_one_cache_and_compile_each_kernel_once(tmp_path):
    cache, out = tmp_path / "cache", tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, ROPEJIT_CACHE_DIR=str(cache), RANKS_OUT=str(out), ROPEJIT_QUIET="1")
    worker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ranks_worker.py")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc_per_node", "2", worker], env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    ranks = [json.loads((out / f"rank{i}.json").read_text()) for i in range(2)]
    entries = len(list(cache.glob("*.rjk")))
    assert entries >= 2
    assert sum(rank["counts"]["compiled"] for rank in ranks) == entries, ranks
    for rank in ranks:
        c = rank["counts"]
        # Every kernel a rank uses was compiled by it, or loaded from what the other published.
        assert c["compiled"] + c["disk_hits"] == entries, rank
    assert ranks[0]["digests"] == ranks[1]["digests"]
