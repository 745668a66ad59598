"""vllm.utils.flashinfer for the peer suite: FlashInfer's rope stays out of the comparison."""


def has_flashinfer():
    return False
