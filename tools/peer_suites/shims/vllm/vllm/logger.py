"""vllm.logger for the peer suite."""

from logging import getLogger as init_logger

__all__ = ["init_logger"]
