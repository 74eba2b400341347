"""Makes every Python process started with this directory on ``PYTHONPATH``
resolve ``mooncake.engine`` and ``mooncake.store`` to kvpool, without a code
change in the engine that imports them::

    PYTHONPATH=$(python3 -m kvpool.shim) python3 -m sglang.launch_server ...

An in-process :func:`kvpool.engine.install_mooncake_shim` is not enough for
SGLang and vLLM: they start their schedulers and workers with
multiprocessing's ``spawn``, fresh interpreters that import Mooncake anew.
Those inherit ``PYTHONPATH``, so the ``sitecustomize`` module here runs in
each of them first and installs the shim (and then the ``sitecustomize`` it
shadows, if the interpreter had one).
"""

import os

#: The directory to put on ``PYTHONPATH``.
DIR = os.path.dirname(os.path.abspath(__file__))
