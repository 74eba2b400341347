"""The ``kvpool`` and ``rbg`` commands of the wheel: they run the binaries
bundled in the package (``kvpool/bin/``), so a pip install brings the pool's
servers and tools without a Rust toolchain.

A package built from source with a plain ``pip install`` bundles none; the
commands then say so and how to get them.
"""

from __future__ import annotations

import os
import sys


def bundled(name: str) -> str:
    """Path of the bundled binary ``name`` (which may not exist)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", name)


def _run(name: str) -> None:
    path = bundled(name)
    if not os.access(path, os.X_OK):
        sys.exit(
            f"{name}: this kvpool package has no bundled {name} binary (it was built "
            "from source, not with scripts/build-wheel.sh); install the released wheel, "
            f"or build it with `cargo build --release -p {'kvpool' if name == 'kvpool' else 'rbg'}`"
        )
    # Replace this process: signals and the exit status are the binary's own.
    os.execv(path, [name, *sys.argv[1:]])


def kvpool() -> None:
    """Entry point of the ``kvpool`` command."""
    _run("kvpool")


def rbg() -> None:
    """Entry point of the ``rbg`` command."""
    _run("rbg")
