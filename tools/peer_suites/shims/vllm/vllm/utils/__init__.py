"""vllm.utils for the peer suite."""
