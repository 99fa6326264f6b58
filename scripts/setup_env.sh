#!/usr/bin/env bash
# Create the project's virtual environment with Python 3.12 and install the project into it.
# Python 3.12 may not be the default python3 (pyenv installs it beside others): look for it.
set -euo pipefail
venv=${1:-.venv}

find_python() {
    local candidate
    for candidate in "${PYTHON:-}" python3.12 "$(command -v pyenv >/dev/null && pyenv root)/versions/"3.12*/bin/python3.12 \
        /usr/local/bin/python3.12 /usr/bin/python3.12 python3; do
        [ -n "$candidate" ] || continue
        if "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
            command -v "$candidate" || echo "$candidate"
            return 0
        fi
    done
    return 1
}

python=$(find_python) || {
    echo "error: Python 3.12 not found. Install it (pyenv install 3.12) or set PYTHON=/path/to/python3.12" >&2
    exit 1
}
echo "using $python ($("$python" --version))"
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
# This machine's pip also looks in local mirrors; their "Location ... is ignored" warnings are noise.
quiet() { "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }; }
quiet "$venv/bin/python" -m pip install --quiet --upgrade pip
# constraints.txt: the versions of the last green CI run, so that a new release changes nothing
# unseen (pyproject.toml keeps the ranges that containers and clusters install from).
quiet "$venv/bin/python" -m pip install --quiet -c constraints.txt -e ".[dev]"
