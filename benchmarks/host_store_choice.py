"""Which embedded store holds the live keyed state of a host: design section 8.

LMDB (`lmdb`) against RocksDB (`rocksdict`) as Python workers would use them: two spawned
processes share one store per partition on local disk, run two partitions at once, and
each partition's next task lands on a random one. LMDB stays open in both processes;
RocksDB allows one read-write process per DB (its LOCK file), so a RocksDB task opens the
DB, works and closes it. Cases: `churn` (~2,000 live keys; a task reads the 1,000 its
predecessor wrote, writes 1,000 and deletes 1,000 in one commit, then bumps a revision),
`large` (1,024 values of 0.5 MB; a task reads 64-byte headers of all, 10 whole values,
rewrites 10) and `open` (open + close; a 2nd process opening while the 1st holds the DB).
Every read is checked against the value last written: verdict 'yes' when all matched.
py-lmdb touches every page of a value it returns (its `preload`), so an LMDB header read
maps the whole value: RSS counts it, PSS shares it out; it is page cache, not anonymous.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import importlib.metadata
import multiprocessing as mp
import os
import random
import shutil
import struct
import tempfile
import time
import traceback
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import lmdb
import rocksdict

STORES = ('lmdb', 'rocksdict')
PARTS = 2  # partitions, one per worker process at a time
REV, PROBE = b'\x00rev', b'\x00probe'
CHART = [('churn', 'tasks/s'), ('large', 'ms per task'), ('large', 'peak PSS MB, both'),
         ('open', 'open+close us')]


@dataclasses.dataclass(frozen=True)
class Sizes:
    churn_keys: int = 1000
    large_keys: int = 1024
    large_bytes: int = 512 * 1024
    whole: int = 10
    rewrite: int = 10
    opens: int = 20


class Row(NamedTuple):
    case: str
    store: str
    figure: str
    value: str
    verdict: str
    number: float | None = None


def key(n: int) -> bytes:
    return b'k' + n.to_bytes(8, 'big')


def small_value(n: int, epoch: int) -> bytes:
    return struct.pack('>QQ', n, epoch) + bytes([n % 251]) * 44  # 60 bytes


class _Store:
    """One partition's store: LMDB environment or RocksDB instance (read-write/secondary)."""

    def __init__(self, kind: str, path: str, secondary: str = '') -> None:
        self.kind = kind
        if kind == 'lmdb':
            self.db = lmdb.open(path, map_size=1 << 40, max_dbs=0, sync=False, metasync=False,
                                readahead=False, max_readers=1024)
            return
        opts = rocksdict.Options(raw_mode=True)
        opts.create_if_missing(True)
        access = rocksdict.AccessType
        self.db = rocksdict.Rdict(path, opts, access_type=access.secondary(secondary)
                                  if secondary else access.read_write())
        if secondary:
            self.db.try_catch_up_with_primary()

    @contextlib.contextmanager
    def reader(self) -> Iterator[Callable[[bytes], Any]]:
        if self.kind == 'rocksdict':
            yield self.db.get
            return
        with self.db.begin(buffers=True) as txn:  # values are memoryviews of the map
            yield txn.get

    def commit(self, puts: list[tuple[bytes, bytes]], deletes: Sequence[bytes] = ()) -> None:
        """One LMDB write transaction or one RocksDB write batch."""
        with (self.db.begin(write=True) if self.kind == 'lmdb' else
              contextlib.nullcontext(rocksdict.WriteBatch(raw_mode=True))) as batch:
            for k in deletes:
                batch.delete(k)
            for k, v in puts:
                batch.put(k, v)
        if self.kind == 'rocksdict':
            self.db.write(batch)

    def close(self) -> None:
        self.db.close()


def _laps(t: float) -> Iterator[float]:
    """Seconds since the previous `next` (the first: since `t`)."""
    while True:
        t0, t = t, time.perf_counter()
        yield t - t0


def _kb(path: str, field: str) -> int:
    with open(path) as f:
        return next((int(line.split()[1]) for line in f if line.startswith(field)), 0)


class _Worker:
    """The work of one Python worker process; LMDB environments stay open in it."""

    def __init__(self, kind: str) -> None:
        self.kind, self.envs, self.held, self.base = kind, {}, None, b''
        self.peak = {'Pss:': 0, 'Anonymous:': 0}

    @contextlib.contextmanager
    def opened(self, path: str) -> Iterator[_Store]:
        """A task's store: LMDB's stays open in the process, RocksDB's is closed after."""
        if self.kind == 'lmdb':
            if path not in self.envs:
                self.envs[path] = _Store(self.kind, path)
            yield self.envs[path]
            return
        store = _Store(self.kind, path)
        try:
            yield store
        finally:
            store.close()

    def mem(self) -> dict:
        """Peak RSS (VmHWM) and the peaks of the PSS and anonymous samples, with one now."""
        for field, peak in self.peak.items():
            self.peak[field] = max(peak, _kb('/proc/self/smaps_rollup', field))
        return {'VmHWM:': _kb('/proc/self/status', 'VmHWM:'), **self.peak}

    def churn_setup(self, path: str, k: int) -> dict:
        with self.opened(path) as store:
            store.commit([(key(n), small_value(n, n // k)) for n in range(2 * k)] +
                         [(REV, (1).to_bytes(8, 'big'))])
        return {'bad': 0}

    def churn_task(self, path: str, epoch: int, k: int) -> dict:
        expected = [(key(n), small_value(n, epoch - 1)) for n in range((epoch - 1) * k, epoch * k)]
        puts = [(key(n), small_value(n, epoch)) for n in range(epoch * k, (epoch + 1) * k)]
        deletes = [key(n) for n in range((epoch - 2) * k, (epoch - 1) * k)]
        lap, bad = _laps(time.perf_counter()), 0
        with self.opened(path) as store:
            opening = next(lap)
            with store.reader() as get:
                bad += int.from_bytes(get(REV), 'big') != epoch - 1
                for kb, value in expected:
                    bad += get(kb) != value
                if epoch >= 3:  # the previous task deleted these
                    bad += get(key((epoch - 3) * k)) is not None
            reading = next(lap)
            store.commit(puts, deletes)
            store.commit([(REV, epoch.to_bytes(8, 'big'))])
            writing = next(lap)
        return {'open': opening + next(lap), 'read': reading, 'write': writing, 'bad': bad}

    def big(self, n: int, version: int, size: int) -> bytes:
        """A 64-byte header (key, version, CRC-32 of the body), then a pseudo-random body."""
        if len(self.base) != size - 64:
            self.base = random.Random(size).randbytes(size - 64)
        off = (n * 7919 + version * 104729) % len(self.base)
        body = self.base[off:] + self.base[:off]
        return struct.pack('>QQI', n, version, zlib.crc32(body)).ljust(64, b'\0') + body

    def large_setup(self, path: str, keys: int, size: int) -> dict:
        lap = _laps(time.perf_counter())
        with self.opened(path) as store:
            for first in range(0, keys, 64):  # commits of 32 MB
                store.commit([(key(n), self.big(n, 0, size))
                              for n in range(first, min(keys, first + 64))])
                self.mem()
        return {'write': next(lap), 'bad': 0}

    def large_task(self, path: str, versions: list[int], whole: list[int],
                   rewrite: list[int], size: int) -> dict:
        puts = [(key(n), self.big(n, versions[n] + 1, size)) for n in rewrite]
        lap, bad = _laps(time.perf_counter()), 0
        with self.opened(path) as store:
            opening = next(lap)
            with store.reader() as get:
                for n, version in enumerate(versions):  # RocksDB reads the whole value
                    bad += struct.unpack_from('>QQ', get(key(n))[:64]) != (n, version)
                for n in whole:
                    value = get(key(n))
                    n_, version, crc = struct.unpack_from('>QQI', value)
                    bad += (n_, version) != (n, versions[n]) or zlib.crc32(value[64:]) != crc
            reading = next(lap)
            store.commit(puts)
            writing = next(lap)
            self.mem()  # before a RocksDB close frees its memory; not timed
            next(lap)
        opening += next(lap)
        return {'open': opening, 'read': reading, 'write': writing,
                'total': opening + reading + writing, 'bad': bad}

    def open_close(self, path: str, times: int) -> dict:
        lap = _laps(time.perf_counter())
        for _ in range(times):
            _Store(self.kind, path).close()
        return {'us': next(lap) / times * 1e6}

    def hold(self, path: str) -> dict:
        """Opens the store and writes PROBE, or closes it if this worker holds it."""
        if self.held:
            self.held.close()
            self.held = None
        else:
            self.held = _Store(self.kind, path)
            self.held.commit([(PROBE, b'held')])
        return {}

    def try_open(self, path: str, secondary: str) -> dict:
        lap = _laps(time.perf_counter())
        try:
            store = _Store(self.kind, path, secondary)
        except Exception as e:  # noqa: BLE001 - the error text is the result
            return {'error': str(e)}
        opening = next(lap)
        with store.reader() as get:
            seen = bytes(get(PROBE) or b'')
        store.close()
        return {'us': opening * 1e6, 'seen': seen}


def _serve(conn: Any, kind: str) -> None:
    worker = _Worker(kind)
    while (message := conn.recv()) is not None:
        try:
            conn.send(getattr(worker, message[0])(*message[1]))
        except Exception:  # noqa: BLE001 - sent to the controller, which raises it
            conn.send(traceback.format_exc())


@contextlib.contextmanager
def _pair(kind: str) -> Iterator[Callable[[list[tuple[int, str, tuple]]], list[dict]]]:
    """Two spawned worker processes (they open stores only once started), and `step`:
    runs each (worker, op, args) at once, one per worker, and waits for all."""
    ctx = mp.get_context('spawn')
    pipes = [ctx.Pipe() for _ in range(2)]
    procs = [ctx.Process(target=_serve, args=(theirs, kind), daemon=True) for _, theirs in pipes]
    for proc in procs:
        proc.start()

    def step(calls: list[tuple[int, str, tuple]]) -> list[dict]:
        for w, op, args in calls:
            pipes[w][0].send((op, args))
        results = [pipes[w][0].recv() for w, _, _ in calls]
        for result in results:
            if isinstance(result, str):  # a worker's traceback
                raise RuntimeError(result)
        return results
    try:
        yield step
    finally:
        for (mine, _), proc in zip(pipes, procs, strict=True):
            mine.send(None)
            proc.join(30)


def _mean(results: list[dict], field: str) -> float:
    return sum(r[field] for r in results) / len(results)


def _rows(case: str, kind: str, results: list[dict], figures: list[tuple[str, Any]]) -> list[Row]:
    verdict = 'yes' if all(r.get('bad', 0) == 0 for r in results) else 'no'
    rows = [Row(case, kind, f, v, verdict) if isinstance(v, str) else
            Row(case, kind, f, f'{v:,.0f}' if v >= 100 else f'{v:.2f}', verdict, v)
            for f, v in figures]
    print(f'{case:6s} {kind:10s} ' + ', '.join(f'{r.figure} {r.value}' for r in rows[:2]) +
          f', verdict {verdict}', flush=True)
    return rows


def _schedule(rng: random.Random) -> list[int]:
    """The worker of each partition for one step: a random one, the other to the other."""
    first = rng.randrange(2)
    return [(first + p) % 2 for p in range(PARTS)]


def churn_case(kind: str, root: str, tasks: int, sizes: Sizes) -> list[Row]:
    k, rng = sizes.churn_keys, random.Random(1)
    paths = [os.path.join(root, kind, f'churn-{p}') for p in range(PARTS)]
    with _pair(kind) as step:
        runs = step([(p, 'churn_setup', (paths[p], k)) for p in range(PARTS)])
        t0 = time.perf_counter()
        for epoch in range(2, tasks + 2):
            runs += step([(w, 'churn_task', (paths[p], epoch, k))
                          for p, w in enumerate(_schedule(rng))])
        wall = time.perf_counter() - t0
    runs, setup = runs[PARTS:], runs[:PARTS]
    return _rows('churn', kind, setup + runs, [
        ('tasks/s', len(runs) / wall), ('us per key read', _mean(runs, 'read') / k * 1e6),
        ('us per key written (+1 delete, commits)', _mean(runs, 'write') / k * 1e6),
        ('ms open+close per task', _mean(runs, 'open') * 1e3)])


def large_case(kind: str, root: str, tasks: int, sizes: Sizes) -> list[Row]:
    n, rng = sizes.large_keys, random.Random(2)
    paths = [os.path.join(root, kind, f'large-{p}') for p in range(PARTS)]
    versions = [[0] * n for _ in range(PARTS)]
    with _pair(kind) as step:
        setup = step([(p, 'large_setup', (paths[p], n, sizes.large_bytes)) for p in range(PARTS)])
        runs = []
        for _ in range(tasks):
            plan = [(w, rng.sample(range(n), sizes.whole), rng.sample(range(n), sizes.rewrite))
                    for w in _schedule(rng)]
            runs += step([(w, 'large_task', (paths[p], versions[p], whole, rewrite,
                                             sizes.large_bytes))
                          for p, (w, whole, rewrite) in enumerate(plan)])
            for p, (_, _, rewrite) in enumerate(plan):
                for m in rewrite:
                    versions[p][m] += 1
        mem = step([(w, 'mem', ()) for w in range(2)])
    mb = {f: [m[f] / 1024 for m in mem] for f in ('VmHWM:', 'Pss:', 'Anonymous:')}
    return _rows('large', kind, setup + runs, [
        ('ms per task', _mean(runs, 'total') * 1e3),
        (f'first write s ({n * sizes.large_bytes / 2**20:g} MB x {PARTS} partitions at once)',
         max(r['write'] for r in setup)),
        ('ms read per task', _mean(runs, 'read') * 1e3),
        ('ms write per task', _mean(runs, 'write') * 1e3),
        ('ms open+close per task', _mean(runs, 'open') * 1e3),
        *[(f'peak {name} MB, worker 0 / 1', '{:,.0f} / {:,.0f}'.format(*mb[f]))
          for name, f in (('RSS', 'VmHWM:'), ('PSS', 'Pss:'), ('anonymous', 'Anonymous:'))],
        ('peak PSS MB, both', sum(mb['Pss:']))])


def open_case(kind: str, root: str, sizes: Sizes) -> list[Row]:
    path = os.path.join(root, kind, 'churn-0')  # the churn case's store, as it left it
    with _pair(kind) as step:
        closing = step([(0, 'open_close', (path, sizes.opens))])
        step([(1, 'hold', (path,))])
        tries = step([(0, 'try_open', (path, ''))])
        if kind == 'rocksdict':
            tries += step([(0, 'try_open', (path, os.path.join(root, 'secondary')))])
        step([(1, 'hold', (path,))])  # releases it
    texts = [f"fails: {t['error'].replace(root, '<tmp>')}" if 'error' in t else
             f"ok, {t['us']:,.0f} us, sees the 1st's write" for t in tries]
    figures = [('open+close us', closing[0]['us']),
               ('2nd process opens read-write while 1st holds it', texts[0]),
               *[('2nd process opens a secondary instance', text) for text in texts[1:]]]
    return _rows('open', kind, closing + [{'bad': t['seen'] != b'held'}
                                          for t in tries if 'error' not in t], figures)


def table(rows: Sequence[Row]) -> str:
    return '\n'.join(['| case | store | figure | value | verdict |', '|---|---|---|---|---|'] +
                     [f"| {r.case} | {r.store} | {r.figure} | {r.value.replace('|', '/')} | "
                      f'{r.verdict} |' for r in rows])


def write_report(rows: Sequence[Row], out: str, tasks: int) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, 'report.md'), 'w') as f:
        f.write(f"""# Host store choice: LMDB or RocksDB for a host's live keyed state

Date: {datetime.date.today()}; cpus: {os.cpu_count()}; py-lmdb {lmdb.__version__} \
(LMDB {'.'.join(map(str, lmdb.version()))}); rocksdict {importlib.metadata.version('rocksdict')}; \
churn tasks per partition: {tasks}; large tasks per partition: {max(2, tasks // 10)}.

{__doc__.split(chr(10), 2)[2].strip()}

{table(rows)}
""")
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(CHART), figsize=(3.2 * len(CHART), 3.2))
    for ax, (case, figure) in zip(axes, CHART, strict=True):
        values = [next(r.number for r in rows if (r.case, r.store, r.figure) == (case, s, figure))
                  for s in STORES]
        ax.bar(STORES, values, color=['tab:blue', 'tab:orange'])
        ax.set_title(f'{case}: {figure}', fontsize=9)
        for i, v in enumerate(values):
            ax.annotate(f'{v:,.1f}', (i, v), ha='center', va='bottom', fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, 'host_store_choice.png'), dpi=100)
    plt.close(fig)


def main(argv: Sequence[str] | None = None, sizes: Sizes = Sizes()) -> list[Row]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--tasks', type=int, default=200,
                        help='churn tasks per partition (large: a tenth, at least 2)')
    parser.add_argument('--out', help='directory for report.md and host_store_choice.png')
    args = parser.parse_args(argv)
    root = tempfile.mkdtemp(prefix='host-store-choice-', dir='/tmp')
    try:
        for kind in STORES:
            os.mkdir(os.path.join(root, kind))
        rows = [r for kind in STORES for r in churn_case(kind, root, args.tasks, sizes)]
        rows += [r for kind in STORES
                 for r in large_case(kind, root, max(2, args.tasks // 10), sizes)]
        rows += [r for kind in STORES for r in open_case(kind, root, sizes)]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(table(rows))
    if args.out:
        write_report(rows, args.out, args.tasks)
    return rows


if __name__ == '__main__':
    main()
