"""vllm.distributed for the peer suite: one process, no tensor parallelism."""


def get_tensor_model_parallel_rank():
    return 0


def get_tensor_model_parallel_world_size():
    return 1
