"""vllm.platforms for the peer suite: a CUDA platform."""


class _CudaPlatform:
    def is_cuda(self):
        return True

    def is_rocm(self):
        return False

    def is_cpu(self):
        return False

    def is_tpu(self):
        return False

    def is_xpu(self):
        return False

    def is_out_of_tree(self):
        return False


current_platform = _CudaPlatform()
