"""vllm for the peer suite: vLLM's rotary_embedding package and, around it, the few vLLM modules
it imports, written here for one CUDA process with no engine (vLLM 0.33's import names). The
suite's kernel seam is vllm/_custom_ops.py, which is ropejit's."""
