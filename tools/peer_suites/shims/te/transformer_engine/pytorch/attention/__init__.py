"""transformer_engine.pytorch.attention for the peer suite; rope.py beside it is TE's own."""
