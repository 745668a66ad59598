"""transformer_engine.pytorch for the peer suite: the real one imports every TE module."""
