"""The types of the runner's flag values, as argparse builds them.

`int_or_text` and `float_or_text` keep a value that is not a number as text, so that
validation reports it together with every other problem (argparse's own `type=int`
would print the usage of every Beam option and exit the program). `SecretUrl` is a
URL that may hold a password (a checkpoint store's): its content is the real URL, for
the Redis client, but str(), repr() and format() show the password as '***', so
printing the options, logging them or an error message never shows it.
"""

from __future__ import annotations

from beam_streams_runner.stores.urls import redacted_url


class SecretUrl(str):
    """A URL whose password stays out of logs and messages.

    The string content is the real URL, so `urllib.parse.urlsplit(url)` and
    `redis.Redis.from_url(url)` see the password; `str()`, `repr()`, `%s`, f-strings
    and `format()` show `redacted`, the URL with the password as '***'. Pass the
    object itself to a client: `str(url)` is the redacted text. `reveal()` gives
    the real URL as a plain `str`, for the one place that needs it.
    """

    __slots__ = ()

    def __new__(cls, value: object = '') -> SecretUrl:
        # str(value) of a SecretUrl is the redacted text: copy the real content instead.
        return super().__new__(cls, str.__str__(value) if isinstance(value, str) else value)

    @property
    def redacted(self) -> str:
        """The URL with its password shown as '***'."""
        return redacted_url(self)

    def reveal(self) -> str:
        """The real URL, password included, as a plain str: never log it."""
        return str.__str__(self)

    def __str__(self) -> str:
        return self.redacted

    def __repr__(self) -> str:
        return repr(self.redacted)

    def __format__(self, format_spec: str) -> str:
        return format(self.redacted, format_spec)

    def __reduce__(self) -> tuple[type, tuple[str]]:
        # Pickled (shipped to Spark tasks, copied) with its real content.
        return (SecretUrl, (str.__str__(self),))


def int_or_text(value: str) -> int | str:
    """The argparse type of the runner's integer flags. A value that is not an integer
    stays text, so that validation reports it with every other problem; argparse's own
    `type=int` would print the usage of every Beam option and exit the program."""
    try:
        return int(value)
    except ValueError:
        return value


def float_or_text(value: str) -> float | str:
    """The argparse type of the runner's number flags: see `int_or_text`."""
    try:
        return float(value)
    except ValueError:
        return value
