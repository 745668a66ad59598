"""ropejit's exceptions: one base class carrying the C API's status code and message, and one
subclass per code so that callers can catch the kind they handle."""

import enum


class ErrorCode(enum.IntEnum):
    """ropejit_status (include/ropejit/ropejit.h); the names of ropejit::ErrorCode."""

    invalid_argument = 1
    compile = 2
    no_driver = 3
    driver = 4
    internal = 5


class Error(RuntimeError):
    """Any ropejit failure. `code` is an ErrorCode, `message` the full text (it names the
    argument and its value, or carries the NVRTC log)."""

    code = ErrorCode.internal

    def __init__(self, message, code=None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = ErrorCode(code)

    def __reduce__(self):  # keep the code across pickling (multiprocessing, torch.compile workers)
        return (type(self), (self.message, int(self.code)))


class InvalidArgument(Error, ValueError):
    """A bad spec, tensor or call argument; nothing was launched. Also a ValueError."""

    code = ErrorCode.invalid_argument


class CompileError(Error):
    """NVRTC rejected the rendered kernel; the message carries the key and the log."""

    code = ErrorCode.compile


class NoDriverError(Error):
    """No CUDA driver or GPU: everything but launching still works."""

    code = ErrorCode.no_driver


class DriverError(Error):
    """A CUDA Driver API call failed."""

    code = ErrorCode.driver


class InternalError(Error):
    code = ErrorCode.internal


_BY_CODE = {cls.code: cls for cls in
            (InvalidArgument, CompileError, NoDriverError, DriverError, InternalError)}


def from_status(status, message):
    """The exception for a non-zero ropejit_status; an unknown code is an InternalError that
    says so (a library newer than this package)."""
    try:
        code = ErrorCode(status)
    except ValueError:
        return InternalError(f"ropejit: unknown status {status}: {message}")
    return _BY_CODE[code](message)
