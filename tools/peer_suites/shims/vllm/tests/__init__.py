"""vLLM's tests/ as a regular package, so that no other installed `tests` package shadows it."""
