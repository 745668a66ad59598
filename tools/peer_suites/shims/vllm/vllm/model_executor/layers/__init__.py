"""vllm.model_executor.layers for the peer suite; rotary_embedding/ beside it is vLLM's own."""
