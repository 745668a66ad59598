"""The QKVFormat that TE's rope.py imports; TE maps the names to its C++ enum, read only by
the fused kernels that the suite's plugin swaps for ropejit's."""

QKVFormat = {"sbhd": "sbhd", "bshd": "bshd", "thd": "thd"}
