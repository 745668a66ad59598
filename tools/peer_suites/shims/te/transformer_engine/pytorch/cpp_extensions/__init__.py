"""transformer_engine.pytorch.cpp_extensions for the peer suite: only what rope.py imports."""
