"""The Python side of NexmarkDump.java: same modes, same output, from benchmarks.nexmark.

    python benchmarks/nexmark/java/dump_python.py golden
    python benchmarks/nexmark/java/dump_python.py lines CONFIG [START [STOP]]
    python benchmarks/nexmark/java/dump_python.py sha CONFIG START STOP

CONFIG as for NexmarkDump: DEFAULT, JAGGED or SINGLE (the configurations of
tests/benchmarks/test_nexmark_generator.py), optionally with overrides named as Java's
NexmarkConfiguration fields (`JAGGED:rateShape=SINE,numEvents=0`). Lines are the test's
`_line` (imported from the test module, so there is one definition of the format), so
`diff <(java ... NexmarkDump lines JAGGED) <(python .../dump_python.py lines JAGGED)` compares
the Java and Python generators event by event (README.md).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import re
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.nexmark.config import (  # noqa: E402
    NexmarkConfig,
    inter_event_delays_us,
    step_length_sec,
)
from benchmarks.nexmark.generator import events  # noqa: E402


def _test_module():
    path = ROOT / 'tests' / 'benchmarks' / 'test_nexmark_generator.py'
    spec = importlib.util.spec_from_file_location('_nexmark_generator_test', path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TEST = _test_module()
CONFIGS = {'DEFAULT': TEST.DEFAULT, 'JAGGED': TEST.JAGGED, 'SINGLE': TEST.SINGLE}


def _snake(name: str) -> str:
    return re.sub(r'(?<!^)(?=[A-Z])', '_', name).lower()


def config(spec: str) -> NexmarkConfig:
    """A configuration of the test, with Java-named field overrides after a colon."""
    name, _, overrides = spec.partition(':')
    base = CONFIGS[name]
    fields = {f.name: f for f in dataclasses.fields(NexmarkConfig)}
    changes = {}
    for assignment in filter(None, overrides.split(',')):
        key, _, text = assignment.partition('=')
        field = _snake(key.strip())
        if field not in fields:
            raise SystemExit(f'no NexmarkConfig field {field!r} (from {key!r})')
        default = fields[field].default
        text = text.strip()
        if isinstance(default, bool):
            value: object = text.lower() == 'true'
        elif isinstance(default, int):
            value = int(text)
        elif isinstance(default, float):
            value = float(text)
        else:
            value = text
        changes[field] = value
    return base.replace(**changes) if changes else base


def lines(cfg: NexmarkConfig, start: int, stop: int | None) -> Iterator[str]:
    for e in events(cfg, start, stop):
        yield TEST._line(e)


def sha(cfg: NexmarkConfig, start: int, stop: int) -> str:
    digest = hashlib.sha256()
    for line in lines(cfg, start, stop):
        digest.update(line.encode() + b'\n')
    return digest.hexdigest()


def golden() -> Iterator[str]:
    """What `NexmarkDump golden` prints, computed by the Python generator."""
    for name, start, stop in (('DEFAULT', 0, 2000), ('DEFAULT', 99_000, 100_000),
                              ('JAGGED', 9000, 11_000)):
        yield f'sha {name} {start} {stop} {sha(config(name), start, stop)}'
    for name, position in (('DEFAULT', 0), ('DEFAULT', 1), ('DEFAULT', 4), ('DEFAULT', 1000),
                           ('DEFAULT', 99_999), ('JAGGED', 9997), ('JAGGED', 9998),
                           ('JAGGED', 19_990)):
        (line,) = lines(config(name), position, position + 1)
        yield f'line {name} {position} {line}'
    for shape, first, nxt, unit, generators in (('SINE', 10_000, 1_000, 'PER_SECOND', 1),
                                                ('SINE', 777, 12_345, 'PER_MINUTE', 3),
                                                ('SQUARE', 10_000, 2_000, 'PER_SECOND', 3)):
        delays = ' '.join(map(str, inter_event_delays_us(shape, first, nxt, unit, generators)))
        yield f'interEventDelayUs {shape} {first} {nxt} {unit} {generators} {delays}'
    yield f'stepLengthSec SINE 600 {step_length_sec("SINE", 600)}'
    yield f'stepLengthSec SQUARE 7 {step_length_sec("SQUARE", 7)}'
    yield f'maxEvents DEFAULT:numEvents=0 {config("DEFAULT:numEvents=0").max_events}'


def main(argv: list[str]) -> int:
    mode = argv[0] if argv else ''
    out = sys.stdout
    if mode == 'golden' and len(argv) == 1:
        for line in golden():
            out.write(line + '\n')
    elif mode == 'lines' and 2 <= len(argv) <= 4:
        cfg = config(argv[1])
        start = int(argv[2]) if len(argv) > 2 else 0
        stop = int(argv[3]) if len(argv) > 3 else None
        for line in lines(cfg, start, stop):
            out.write(line + '\n')
    elif mode == 'sha' and len(argv) == 4:
        out.write(sha(config(argv[1]), int(argv[2]), int(argv[3])) + '\n')
    else:
        sys.stderr.write('usage: dump_python.py golden | lines CONFIG [START [STOP]] '
                         '| sha CONFIG START STOP\n')
        return 2
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
