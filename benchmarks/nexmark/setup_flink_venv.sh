#!/usr/bin/env bash
# Create .venv-flink: a separate virtualenv with PyFlink (`apache-flink` on PyPI, which
# ships Flink itself) for the NEXMark PyFlink baselines (`--native flink`).
#
# PyFlink pins an old apache-beam (apache-flink 2.3: apache-beam>=2.54,<=2.61), so it
# cannot share the project's environment (Beam 2.77). The launcher runs
# `benchmarks/nexmark/flink_baselines.py` (batch) and the streaming comparison
# `benchmarks/nexmark/flink_streaming.py` with this venv's python in a subprocess.
# Flink needs Java 11 or 17 (`java` on the PATH or JAVA_HOME) to run, not to install.
#
# The default is pinned to the version this project's PyFlink programs were checked with
# (apache-flink 2.3.0 on Python 3.11 and Java 17: about 50 s and 850 MB); the programs
# use APIs that moved between Flink versions, so a newer one is a choice to test first.
#
# Usage (from anywhere, unattended; re-running it updates the venv in place):
#     bash benchmarks/nexmark/setup_flink_venv.sh
# Environment: PYTHON (default python3.11), FLINK_VENV (default <repo>/.venv-flink),
#              APACHE_FLINK (pip requirement, default apache-flink==2.3.0).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
python="${PYTHON:-python3.11}"
venv="${FLINK_VENV:-$repo/.venv-flink}"
requirement="${APACHE_FLINK:-apache-flink==2.3.0}"

if ! command -v "$python" >/dev/null 2>&1; then
    echo "error: $python not found; set PYTHON to a Python 3.11 interpreter" >&2
    exit 1
fi

if ! command -v java >/dev/null 2>&1 && [ -z "${JAVA_HOME:-}" ]; then
    echo "warning: no java on the PATH and no JAVA_HOME; PyFlink needs Java 11 or 17" >&2
fi

"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip setuptools wheel
"$venv/bin/python" -m pip install --quiet "$requirement"
"$venv/bin/python" - <<'EOF'
import apache_beam
import pyflink.version
print(f'PyFlink {pyflink.version.__version__} (apache-beam {apache_beam.__version__})')
EOF
echo "created $venv; run e.g.:"
echo "  python -m benchmarks.nexmark --runner=DirectRunner --query=0-3 --native flink"
