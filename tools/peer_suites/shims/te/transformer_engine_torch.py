"""transformer_engine_torch (TE's compiled extension) for the peer suite: TE's fused kernels are
swapped for ropejit.dropin.transformer_engine, so any call that reaches here was not."""


def __getattr__(name):
    raise NotImplementedError(f"transformer_engine_torch.{name}: TE's own kernel, which the peer "
                              f"suite does not have; ropejit.dropin.transformer_engine has no "
                              f"drop-in for the function that called it")
