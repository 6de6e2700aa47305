"""Checkpoint store URLs made safe to show: passwords replaced by '***'.

Design section 8, "Checkpoint stores": a Redis store's URL may carry its
password (`redis://:password@host:port/db`, or `?password=` in the query, which
redis-py also accepts). Every repr, error message and log line that names a
store shows `redacted_url(url)` instead of the URL itself.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

REDACTED = '***'

# Query arguments that carry a secret (redis-py passes unknown ones on as keywords).
_SECRET_QUERY = re.compile(r'((?:^|&)[^=&]*pass[^=&]*=)[^&]*', re.IGNORECASE)


def redacted_url(url: str) -> str:
    """`url` with any password (in the user info or the query) replaced by '***'."""
    try:
        parts = urlsplit(url)
    except ValueError:
        # Not even parseable: show only its scheme, the rest may hold a password.
        scheme = url.split(':', 1)[0] if ':' in url else ''
        return f'{scheme}://{REDACTED}' if scheme else REDACTED
    netloc = parts.netloc
    userinfo, at, hostport = netloc.rpartition('@')
    if at:
        user, colon, _ = userinfo.partition(':')
        # Without a ':' it is a user name to redis-py, but a password written there by
        # mistake (`redis://secret@host`) must not show either: mask it too.
        netloc = f'{user}:{REDACTED}@{hostport}' if colon else f'{REDACTED}@{hostport}'
    query = _SECRET_QUERY.sub(lambda m: m.group(1) + REDACTED, parts.query)
    if (netloc, query) == (parts.netloc, parts.query):
        return url
    if '://' not in url:
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    # By hand: urlunsplit drops the '//' of an empty host ('unix:///path').
    return (f'{parts.scheme}://{netloc}{parts.path}' + (f'?{query}' if query else '') +
            (f'#{parts.fragment}' if parts.fragment else ''))


def scrub(text: str, url: str) -> str:
    """`text` (e.g. a client library's error) with the password of `url` masked out."""
    for secret in _secrets(url):
        text = text.replace(secret, REDACTED)
    return text


def _secrets(url: str) -> list[str]:
    try:
        parts = urlsplit(url)
    except ValueError:
        return []
    found = []
    userinfo, at, _ = parts.netloc.rpartition('@')
    if at:
        secret = userinfo.partition(':')[2] if ':' in userinfo else userinfo
        found += [secret, unquote(secret)]
    found += [value for name, value in parse_qsl(parts.query) if 'pass' in name.lower()]
    # Longest first, so that a password containing another is masked whole.
    return sorted({s for s in found if s}, key=len, reverse=True)
