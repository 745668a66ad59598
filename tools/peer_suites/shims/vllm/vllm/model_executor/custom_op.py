"""vLLM's CustomOp as the suite meets it on a CUDA device with custom ops enabled (vLLM's
default outside torch.compile): forward() is forward_cuda()."""

from torch import nn


class CustomOp(nn.Module):
    name = "custom_op"

    def __init__(self, *, enforce_enable=False, compile_native=False):
        super().__init__()

    @classmethod
    def enabled(cls):
        return True

    @classmethod
    def register(cls, name):
        def decorator(op_cls):
            op_cls.name = name
            return op_cls
        return decorator

    def forward(self, *args, **kwargs):
        return self.forward_cuda(*args, **kwargs)

    def forward_hip(self, *args, **kwargs):
        return self.forward_cuda(*args, **kwargs)


class PluggableLayer(nn.Module):
    @classmethod
    def register(cls, name):
        return lambda layer_cls: layer_cls
