# Sourced by the scripts that make virtualenvs. make_venv PYTHON DIR creates
# a virtualenv at DIR. Debian's python3 has no ensurepip without the
# python3-venv package: then virtualenv comes from PyPI instead, into a side
# directory beside DIR (not the system).
make_venv() {
  local python="$1" dir="$2" tool
  if "$python" -m venv "$dir" >/dev/null 2>&1; then return; fi
  echo "python -m venv is unavailable (Debian: python3-venv); using virtualenv from PyPI" >&2
  rm -rf "$dir"
  tool="$(dirname "$dir")/.virtualenv-tool"
  "$python" -m pip install -q --disable-pip-version-check --upgrade --target "$tool" virtualenv
  PYTHONPATH="$tool" "$python" -m virtualenv -q "$dir"
}
