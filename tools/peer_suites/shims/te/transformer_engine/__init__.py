"""transformer_engine for the peer suite: the real package root loads TE's CUDA libraries."""
