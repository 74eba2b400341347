"""``python3 -m kvpool.shim`` prints the directory to put on ``PYTHONPATH``."""

from . import DIR

print(DIR)
