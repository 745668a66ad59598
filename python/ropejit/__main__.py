"""`python -m ropejit info|compile|tune|demo|source ...`: runs the ropejit command installed
inside this package with the same arguments (the console script's _ropejit_cli.main)."""

import os


def main(argv=None):
    from _ropejit_cli import main as run_command

    run_command(argv, package_dir=os.path.dirname(os.path.abspath(__file__)))


if __name__ == "__main__":
    main()
