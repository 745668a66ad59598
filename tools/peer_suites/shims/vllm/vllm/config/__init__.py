"""vllm.config for the peer suite: there is no engine, so no current config."""


def get_current_vllm_config():
    raise RuntimeError("the peer suite runs without a vLLM engine config")
