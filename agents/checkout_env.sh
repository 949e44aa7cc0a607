# Source from the repository root on a machine where the checkout is not pip-installed (a lent
# GPU machine without network): puts the checkout on PYTHONPATH for `jaxsal` and exposes the
# folder agents/ under its installed name `jaxsal_agents` (a symlink in a temporary directory),
# so scripts use the one name everywhere. A no-op where `pip install -e .` already provides it.
#
#   source agents/checkout_env.sh      # needs PY (the interpreter) set; exports PYTHONPATH
_py=${PY:-python3}
if ! "$_py" -c "import importlib.util as u, sys; sys.exit(u.find_spec('jaxsal_agents') is None)" 2>/dev/null; then
  _pkg=$(mktemp -d "${TMPDIR:-/tmp}/jaxsal-checkout.XXXXXX")
  ln -s "$PWD/agents" "$_pkg/jaxsal_agents"
  export PYTHONPATH="$_pkg:$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
unset _py _pkg
