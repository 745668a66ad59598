"""One rank of tests/python/test_ranks.py, started by torchrun: on its own GPU (LOCAL_RANK), a
few RoPE keys at decode and prefill sizes, each against float64; writes its cache counts and a
checksum of its outputs to $RANKS_OUT/rank<r>.json. Not a test module (no test_ prefix)."""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import references as ref  # noqa: E402

import ropejit  # noqa: E402


def main():
    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    torch.manual_seed(1234)  # the same inputs on every rank
    inv = 10000.0 ** (-torch.arange(0, 128, 2, dtype=torch.float64) / 128)
    angles = torch.arange(4096, dtype=torch.float64)[:, None] * inv
    cos, sin = angles.cos().float().cuda(), angles.sin().float().cuda()
    digests, worst = [], 0.0
    for dtype in (torch.bfloat16, torch.float16):
        for tokens in (1, 8, 512):
            q = torch.randn(tokens, 32, 128, dtype=dtype).cuda()[None]
            k = torch.randn(tokens, 8, 128, dtype=dtype).cuda()[None]
            ids = torch.randint(0, 4096, (tokens,), device="cuda")
            want_q = ref.rotate(q.cpu(), cos.cpu()[ids.cpu()][None, :, None],
                                sin.cpu()[ids.cpu()][None, :, None], False)
            ropejit.apply(q, k, cos=cos, sin=sin, position_ids=ids)
            torch.cuda.synchronize()
            ref.assert_close(q, want_q)
            worst = max(worst, (q.cpu().double() - want_q).abs().max().item())
            digests.append(int(q.view(torch.int16).long().sum().item()))
    counts = vars(ropejit.cache_counts())
    with open(os.path.join(os.environ["RANKS_OUT"], f"rank{rank}.json"), "w") as f:
        json.dump(dict(rank=rank, counts=counts, digests=digests, worst=worst), f)


if __name__ == "__main__":
    main()
