"""Launcher: run a Beam pipeline program with the short runner name available.

    python -m beam_streams_runner my_pipeline.py --runner=StreamsSparkRunner ...
    python -m beam_streams_runner -m some.package.module --runner=StreamsSparkRunner ...

It imports `beam_streams_runner` (which registers `StreamsSparkRunner` as a
short runner name) and then runs the program as `python SCRIPT ARGS...` or
`python -m MODULE ARGS...` would: as `__main__`, with `sys.argv` set to the
program and its arguments. The program itself needs no change.
"""

from __future__ import annotations

import os
import runpy
import sys

USAGE = """\
usage: python -m beam_streams_runner SCRIPT [ARGS...]
       python -m beam_streams_runner -m MODULE [ARGS...]

Runs a Beam pipeline program (a script, or a module with -m) after importing
beam_streams_runner, so that --runner=StreamsSparkRunner works in it without the
program importing beam_streams_runner itself. ARGS are passed to the program.

Runner options (with --runner=StreamsSparkRunner):
  --spark_master=MASTER   local[*] (default), local[N], spark://host:port, yarn, k8s://...
  --spark_conf=KEY=VALUE  a Spark configuration property; repeat for several
  --parallelism=N         partitions per stage (default: Spark's defaultParallelism)
  --bundle_size=N         max elements per source bundle (default 1000)
  --bundle_time_ms=MS     max time to fill a source bundle (default 100)

example:
  python -m beam_streams_runner wordcount.py --runner=StreamsSparkRunner --output=/tmp/out
"""


def main(argv: list[str] | None = None) -> int:
    """Run the program named in `argv` (default: sys.argv[1:]); return an exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ('-h', '--help'):
        stream = sys.stdout if args else sys.stderr
        stream.write(USAGE)
        return 0 if args else 2

    import beam_streams_runner  # noqa: F401  (registers the short runner name)

    if args[0] == '-m':
        if len(args) < 2:
            sys.stderr.write('error: -m needs a module name\n\n' + USAGE)
            return 2
        module, program_args = args[1], args[2:]
        sys.argv = [module, *program_args]  # run_module puts the module's path in argv[0]
        if sys.path[0] != os.getcwd():
            sys.path.insert(0, os.getcwd())
        runpy.run_module(module, run_name='__main__', alter_sys=True)
        return 0

    script, program_args = args[0], args[1:]
    if not os.path.exists(script):
        sys.stderr.write(f'error: no such file: {script}\n\n' + USAGE)
        return 2
    sys.argv = [script, *program_args]
    # As `python SCRIPT` does: the script's folder comes first on sys.path.
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name='__main__')
    return 0


if __name__ == '__main__':
    sys.exit(main())
