"""`python -m ropejit info|compile|tune|demo|source ...` (and the `ropejit` console script): runs
the ropejit command installed inside this package with the same arguments."""

import os
import sys


def main(argv=None):
    from ropejit._library import command_path

    args = sys.argv[1:] if argv is None else list(argv)
    try:
        command = command_path()
    except FileNotFoundError as e:
        sys.exit(str(e))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(command, [command, *args])  # the command's exit code is the process's


if __name__ == "__main__":
    main()
