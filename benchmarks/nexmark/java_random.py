"""`java.util.Random`, bit for bit, as Beam's Java NEXMark generator uses it.

Java's `Generator.nextEvent` seeds a fresh `new Random(eventId)` for every event and
draws every field from it (`PersonGenerator`, `AuctionGenerator`, `BidGenerator`,
`PriceGenerator`, `StringsGenerator`, `LongGenerator`), so reproducing those events
needs the exact generator of the JDK: a 48-bit linear congruential generator
(multiplier 0x5DEECE66D, addend 0xB) whose seed is scrambled by XOR with the
multiplier, with `next(bits)` and the derived methods as specified by the
`java.util.Random` documentation (unchanged since JDK 1.2, still so in JDK 17/21):

* `nextInt()` = `next(32)` as a signed 32-bit int;
* `nextInt(bound)`: `next(31)` scaled for a power-of-two bound, otherwise the
  rejection loop `for (u = r; u - (r = u % bound) + m < 0; u = next(31))` whose test
  relies on 32-bit overflow;
* `nextLong()` = `((long) next(32) << 32) + next(32)` with 64-bit wrap-around;
* `nextDouble()` = `(((long) next(26) << 27) + next(27)) * 2**-53`.

Also the Java integer arithmetic the generators rely on (`/` and `%` truncate toward
zero, `Math.round`), which Python's floor division does not give for negative values.
"""

from __future__ import annotations

import math

_MULTIPLIER = 0x5DEECE66D
_ADDEND = 0xB
_MASK = (1 << 48) - 1
_DOUBLE_UNIT = 1.0 / (1 << 53)

INT_MIN = -(1 << 31)
INT_MAX = (1 << 31) - 1
LONG_MAX = (1 << 63) - 1


def to_int32(value: int) -> int:
    """Java's `(int) value`: the low 32 bits as a signed int."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value


def to_int64(value: int) -> int:
    """Java's `(long) value`: the low 64 bits as a signed long."""
    value &= 0xFFFFFFFFFFFFFFFF
    return value - (1 << 64) if value & 0x8000000000000000 else value


def java_div(a: int, b: int) -> int:
    """Java's integer `a / b`: truncates toward zero."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def java_rem(a: int, b: int) -> int:
    """Java's integer `a % b`: has the sign of `a`."""
    return a - java_div(a, b) * b


def java_round(x: float) -> int:
    """Java's `Math.round(double)`: the closest long, ties toward positive infinity.

    Computed as `floor(x)` plus one when the fraction is at least 1/2; `x - floor(x)` is
    exact for every double, so this avoids the `floor(x + 0.5)` error at 0.49999999999999994.
    """
    if math.isnan(x):
        return 0
    if x >= LONG_MAX:
        return LONG_MAX
    if x <= -(1 << 63):
        return -(1 << 63)
    floor = math.floor(x)
    return int(floor) + (1 if x - floor >= 0.5 else 0)


class JavaRandom:
    """A `java.util.Random`: same seed, same sequence as the JDK's."""

    __slots__ = ('_seed',)

    def __init__(self, seed: int) -> None:
        self.set_seed(seed)

    def set_seed(self, seed: int) -> None:
        """`setSeed(long)`: scrambles the seed with the multiplier."""
        self._seed = (to_int64(seed) ^ _MULTIPLIER) & _MASK

    def next(self, bits: int) -> int:
        """`next(bits)`: advances the LCG, returns its top `bits` bits (signed int)."""
        self._seed = (self._seed * _MULTIPLIER + _ADDEND) & _MASK
        return to_int32(self._seed >> (48 - bits))

    def next_int(self, bound: int | None = None) -> int:
        """`nextInt()` (any int) or `nextInt(bound)` (uniform in [0, bound))."""
        if bound is None:
            return self.next(32)
        if bound <= 0:
            raise ValueError('bound must be positive')
        if bound > INT_MAX:
            raise ValueError('bound must be a Java int')
        r = self.next(31)
        m = bound - 1
        if bound & m == 0:
            # Power of two: the high bits, `(int) ((bound * (long) r) >> 31)`.
            return (bound * r) >> 31
        u = r
        r = u % bound
        # `u - r + m < 0` in Java's 32-bit arithmetic: true when the sum overflows.
        while u - r + m > INT_MAX:
            u = self.next(31)
            r = u % bound
        return r

    def next_long(self) -> int:
        """`nextLong()`: two `next(32)` joined, with 64-bit wrap-around."""
        return to_int64((self.next(32) << 32) + self.next(32))

    def next_double(self) -> float:
        """`nextDouble()`: 53 random bits scaled into [0, 1)."""
        return ((self.next(26) << 27) + self.next(27)) * _DOUBLE_UNIT

    def next_boolean(self) -> bool:
        """`nextBoolean()`."""
        return self.next(1) != 0
