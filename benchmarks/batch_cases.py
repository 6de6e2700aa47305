"""The three batch pipelines of `benchmarks.batch_speed`, each as Beam and as PySpark.

* `wordcount`: `ReadFromText` of `2M x scale` words (10k distinct, `WORDS_PER_LINE` a
  line) -> `FlatMap(str.split)` -> `Map((w, 1))` -> `CombinePerKey(sum)` -> `WriteToText`;
  PySpark: `textFile -> flatMap -> map -> reduceByKey -> saveAsTextFile`.
* `gbk`: `1M x scale` pairs over 10k keys from `Create(range(1000))` and a `FlatMap`, a
  `GroupByKey`, the sum per key -> `WriteToText`; PySpark: `parallelize -> flatMap ->
  groupByKey -> map -> saveAsTextFile`.
* `maps`: `1M x scale` ints the same way, 20 chained `Map(x + 1)`, `CombineGlobally(sum)`
  -> `WriteToText`; PySpark: 20 `map`s and `sum`, the total saved as a text file.

Each case writes text lines whose expected multiset `expected_lines` computes in plain
Python, so every run's output is checked, on every runner alike.
"""

from __future__ import annotations

import collections
import os
import random
from collections.abc import Callable
from dataclasses import dataclass

import apache_beam as beam
from apache_beam.io import ReadFromText, WriteToText

WORDS_PER_LINE = 10
WORDS = 2_000_000
DISTINCT_WORDS = 10_000
PAIRS = 1_000_000
KEYS = 10_000
SEEDS = 1000  # the Create of the gbk and maps cases: each seed expands to PAIRS / SEEDS
MAPS = 20


@dataclass(frozen=True)
class CaseInput:
    """What a case runs over: its size, its input file (if it reads one) and the lines
    its output must hold."""

    elements: int
    path: str | None
    expected: list[str]


@dataclass(frozen=True)
class BatchCase:
    name: str
    title: str
    prepare: Callable[[str, float], CaseInput]  # (work directory, scale) -> input
    beam: Callable[[beam.Pipeline, CaseInput, str], None]  # writes under the prefix
    pyspark: Callable[..., None]  # (SparkContext, input, prefix)


# Word count --------------------------------------------------------------------------
def generate_words(path: str, words: int, distinct: int, seed: int = 0) -> collections.Counter:
    """Writes `words` words of `distinct` different ones (`w0` ... uniformly drawn,
    `WORDS_PER_LINE` per line) to `path`; returns how often each word was written."""
    rng = random.Random(seed)
    vocabulary = [f'w{i}' for i in range(distinct)]
    counts: collections.Counter = collections.Counter()
    with open(path, 'w', encoding='utf-8') as f:
        for start in range(0, words, WORDS_PER_LINE):
            line = rng.choices(vocabulary, k=min(WORDS_PER_LINE, words - start))
            counts.update(line)
            f.write(' '.join(line) + '\n')
    return counts


def format_count(word_count: tuple[str, int]) -> str:
    word, count = word_count
    return f'{word}: {count}'


def _prepare_wordcount(work: str, scale: float) -> CaseInput:
    words = max(WORDS_PER_LINE, round(WORDS * scale))
    path = os.path.join(work, f'words-{words}.txt')
    counts = generate_words(path, words, min(DISTINCT_WORDS, words))
    return CaseInput(words, path, [format_count(item) for item in counts.items()])


def build_wordcount(p: beam.Pipeline, case_input: CaseInput, prefix: str) -> None:
    """The word count as a user writes it."""
    _ = (p
         | 'Read' >> ReadFromText(case_input.path)
         | 'Split' >> beam.FlatMap(str.split)
         | 'Pair' >> beam.Map(lambda word: (word, 1))
         | 'Count' >> beam.CombinePerKey(sum)
         | 'Format' >> beam.Map(format_count)
         | 'Write' >> WriteToText(prefix))


def _pyspark_wordcount(sc, case_input: CaseInput, prefix: str) -> None:
    (sc.textFile(case_input.path)
     .flatMap(str.split)
     .map(lambda word: (word, 1))
     .reduceByKey(lambda a, b: a + b)
     .map(format_count)
     .saveAsTextFile(prefix))


# GroupByKey --------------------------------------------------------------------------
def _per_seed(n: int) -> int:
    return max(1, n // SEEDS)


def _pairs_of(per_seed: int) -> Callable[[int], list[tuple[int, int]]]:
    def pairs(seed: int) -> list[tuple[int, int]]:
        start = seed * per_seed
        return [(i % KEYS, i) for i in range(start, start + per_seed)]
    return pairs


def _ints_of(per_seed: int) -> Callable[[int], range]:
    def ints(seed: int) -> range:
        return range(seed * per_seed, (seed + 1) * per_seed)
    return ints


def _sum_line(key_values) -> str:
    key, values = key_values
    return f'{key}: {sum(values)}'


def _prepare_gbk(work: str, scale: float) -> CaseInput:
    per_seed = _per_seed(round(PAIRS * scale))
    sums: collections.Counter = collections.Counter()
    for i in range(per_seed * SEEDS):
        sums[i % KEYS] += i
    return CaseInput(per_seed * SEEDS, None, [f'{k}: {s}' for k, s in sums.items()])


def build_gbk(p: beam.Pipeline, case_input: CaseInput, prefix: str) -> None:
    _ = (p
         | 'Seeds' >> beam.Create(range(SEEDS))
         | 'Pairs' >> beam.FlatMap(_pairs_of(case_input.elements // SEEDS))
         | 'Group' >> beam.GroupByKey()
         | 'Sum' >> beam.Map(_sum_line)
         | 'Write' >> WriteToText(prefix))


def _pyspark_gbk(sc, case_input: CaseInput, prefix: str) -> None:
    (sc.parallelize(range(SEEDS))
     .flatMap(_pairs_of(case_input.elements // SEEDS))
     .groupByKey()
     .map(_sum_line)
     .saveAsTextFile(prefix))


# Twenty maps -------------------------------------------------------------------------
def _prepare_maps(work: str, scale: float) -> CaseInput:
    n = _per_seed(round(PAIRS * scale)) * SEEDS
    return CaseInput(n, None, [str(n * (n - 1) // 2 + MAPS * n)])


def build_maps(p: beam.Pipeline, case_input: CaseInput, prefix: str) -> None:
    ints = (p
            | 'Seeds' >> beam.Create(range(SEEDS))
            | 'Ints' >> beam.FlatMap(_ints_of(case_input.elements // SEEDS)))
    for step in range(MAPS):
        ints = ints | f'Plus one {step + 1}' >> beam.Map(lambda x: x + 1)
    _ = (ints
         | 'Sum' >> beam.CombineGlobally(sum)
         | 'Write' >> WriteToText(prefix))


def _pyspark_maps(sc, case_input: CaseInput, prefix: str) -> None:
    ints = sc.parallelize(range(SEEDS)).flatMap(_ints_of(case_input.elements // SEEDS))
    for _ in range(MAPS):
        ints = ints.map(lambda x: x + 1)
    sc.parallelize([str(ints.sum())], 1).saveAsTextFile(prefix)


CASES: dict[str, BatchCase] = {case.name: case for case in (
    BatchCase('wordcount', 'word count', _prepare_wordcount, build_wordcount,
              _pyspark_wordcount),
    BatchCase('gbk', 'GroupByKey and a sum per key', _prepare_gbk, build_gbk, _pyspark_gbk),
    BatchCase('maps', f'{MAPS} chained Maps and a global sum', _prepare_maps, build_maps,
              _pyspark_maps),
)}
