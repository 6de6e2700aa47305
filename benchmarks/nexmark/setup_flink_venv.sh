#!/usr/bin/env bash
# Create .venv-flink: a separate virtualenv with PyFlink (`apache-flink` on PyPI, which
# ships Flink itself) for the NEXMark PyFlink baselines (`--native flink`).
#
# PyFlink pins an old apache-beam (apache-flink 2.3: apache-beam>=2.54,<=2.61), so it
# cannot share the project's environment (Beam 2.77). The launcher runs
# `benchmarks/nexmark/flink_baselines.py` with this venv's python in a subprocess.
# Flink needs Java 11 or 17 (`java` on the PATH or JAVA_HOME).
#
# Usage (from anywhere):  bash benchmarks/nexmark/setup_flink_venv.sh
# Environment: PYTHON (default python3.11), FLINK_VENV (default <repo>/.venv-flink),
#              APACHE_FLINK (pip requirement, default apache-flink).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
python="${PYTHON:-python3.11}"
venv="${FLINK_VENV:-$repo/.venv-flink}"
requirement="${APACHE_FLINK:-apache-flink}"

if ! command -v java >/dev/null 2>&1 && [ -z "${JAVA_HOME:-}" ]; then
    echo "warning: no java on the PATH and no JAVA_HOME; PyFlink needs Java 11 or 17" >&2
fi

"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --upgrade pip setuptools wheel
"$venv/bin/python" -m pip install "$requirement"
"$venv/bin/python" - <<'EOF'
import apache_beam
import pyflink.version
print(f'PyFlink {pyflink.version.__version__} (apache-beam {apache_beam.__version__})')
EOF
echo "created $venv; run e.g.:"
echo "  python -m benchmarks.nexmark --runner=DirectRunner --query=0-3 --native flink"
