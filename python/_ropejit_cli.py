"""The `ropejit` console script: runs the command installed inside the ropejit package without
importing the package, whose import loads the library and costs many times the command's own
start-up. Where the command lies and how it is started is defined here once: ropejit/__main__.py
(`python -m ropejit`) and ropejit.command_path() use it too."""

import importlib.util
import os
import sys


def command_path(package_dir):
    """The `ropejit` command inside the package folder `package_dir`; FileNotFoundError when it
    is missing."""
    path = os.path.join(package_dir, "bin", "ropejit")
    if not os.access(path, os.X_OK):
        raise FileNotFoundError(f"ropejit: the command {path} is not installed with this "
                                f"package: reinstall it with `pip install .`")
    return path


def main(argv=None, package_dir=None):
    """Replaces this process with the command, given `argv` (default: this process's
    arguments); the command's exit code is the process's."""
    if package_dir is None:
        spec = importlib.util.find_spec("ropejit")  # locates the package without running it
        if spec is None or not spec.submodule_search_locations:
            sys.exit("ropejit: the ropejit package is not installed: `pip install .` installs it")
        package_dir = spec.submodule_search_locations[0]
    try:
        command = command_path(package_dir)
    except FileNotFoundError as e:
        sys.exit(str(e))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(command, [command, *(sys.argv[1:] if argv is None else argv)])
