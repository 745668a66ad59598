"""vllm.utils.torch_utils for the peer suite: the seeding the test calls, as vLLM's
(torch.manual_seed seeds every CUDA device too), and the names the rotary modules import."""

import random

import numpy as np
import torch


def set_random_seed(seed, data_parallel_index=0):
    if seed is not None:
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)


def direct_register_custom_op(*args, **kwargs):
    """vLLM registers its FlashInfer and Triton mRoPE ops here; neither is on the suite's path."""


def async_tensor_h2d(*args, **kwargs):
    raise NotImplementedError("vLLM's mRoPE ViT setup is not on the suite's path")
