"""The `ropejit` console script: runs the command installed inside the ropejit package without
importing the package, whose import loads the library and costs many times the command's own
start-up. (`python -m ropejit` is ropejit/__main__.py.)"""

import importlib.util
import os
import sys


def main():
    spec = importlib.util.find_spec("ropejit")  # locates the package without running it
    if spec is None or not spec.submodule_search_locations:
        sys.exit("ropejit: the ropejit package is not installed: `pip install .` installs it")
    command = os.path.join(spec.submodule_search_locations[0], "bin", "ropejit")
    if not os.access(command, os.X_OK):
        sys.exit(f"ropejit: the command {command} is not installed with this package: "
                 f"reinstall it with `pip install .`")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(command, [command, *sys.argv[1:]])  # the command's exit code is the process's
