"""Run by every interpreter that has ``kvpool/shim`` on ``PYTHONPATH`` (see
the package's docs): resolves ``mooncake.engine`` and ``mooncake.store`` to
kvpool, then runs the ``sitecustomize`` this module shadows, if any."""

import importlib.util
import os
import sys

from kvpool.engine import install_mooncake_shim

install_mooncake_shim()

_here = os.path.dirname(os.path.abspath(__file__))
for _dir in sys.path:
    _file = os.path.join(os.path.abspath(_dir or "."), "sitecustomize.py")
    if os.path.dirname(_file) != _here and os.path.isfile(_file):
        _spec = importlib.util.spec_from_file_location("_kvpool_shadowed_sitecustomize", _file)
        if _spec is not None and _spec.loader is not None:
            _spec.loader.exec_module(importlib.util.module_from_spec(_spec))
        break
