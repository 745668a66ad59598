"""vllm.model_executor for the peer suite."""
