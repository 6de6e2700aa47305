"""URLs made safe to show: passwords replaced by '***'.

Design section 8, "Checkpoint stores": a Redis URL may carry its password
(`redis://[user]:password@host:port/db`, or `?password=` in the query, which
redis-py also accepts). Every repr, error message and log line that names a
store, a Redis sink or source, or a command-line flag holding such a URL shows
`redacted_url(url)` instead of the URL itself; `option_types.SecretUrl` shows it for
its str() and repr().
"""

from __future__ import annotations

import re
from urllib.parse import unquote

REDACTED = '***'

# A scheme, not a path: '/dir?password=x' is a directory name, 'unix:/s?password=x' a URL.
_SCHEME = re.compile(r'(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*:')
# scheme:// then the user information: everything up to the LAST '@', since an unencoded
# '@' (or '/', '?', '#') in a password must not leave part of it in sight.
_USERINFO = re.compile(r'(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>.*)@', re.DOTALL)
# A query argument carrying a secret (redis-py passes unknown ones on as keywords).
_SECRET_QUERY = re.compile(r'(?P<name>[?&][^=&#?]*pass[^=&#]*=)(?P<value>[^&#]*)',
                           re.IGNORECASE)


def redacted_url(url: str) -> str:
    """`url` with its password shown as '***' (the user name is kept): in the user
    information, and in any query argument whose name holds 'pass'. `url` may also be a
    text holding a URL, such as a command-line flag (`--checkpoint_store=redis://...`).

    Errs on hiding: user information without ':' (which Redis may take as a password)
    and a user name holding '/', '?' or '#' are hidden whole; a text that is not a URL
    (a path, even with '?password=' in it) comes back as it is.
    """
    text = str.__str__(url)  # the real content, also of a SecretUrl
    if not _SCHEME.search(text):
        return text
    text = _SECRET_QUERY.sub(lambda query: query.group('name') + REDACTED, text)
    span = _userinfo_span(text)
    if span is None:
        return text
    start, end = span
    user, colon, _ = text[start:end].partition(':')
    shown = f'{user}:{REDACTED}' if colon and not set(user) & set('/?#') else REDACTED
    return text[:start] + shown + text[end:]


def scrub(text: str, url: str) -> str:
    """`text` (e.g. a client library's error) with the password of `url` masked out."""
    for secret in _secrets(url):
        text = text.replace(secret, REDACTED)
    return text


def _userinfo_span(text: str) -> tuple[int, int] | None:
    """Where the user information of the URL in `text` is, if it has any."""
    match = _USERINFO.search(text)
    if match is None:
        return None
    if match.group('scheme').lower() == 'file://':
        # A file URL's path may hold '@': only an '@' in the host part is user information.
        authority = text[match.start('userinfo'):].split('/', 1)[0]
        if '@' not in authority:
            return None
        match = _USERINFO.search(text, 0, match.start('userinfo') + len(authority))
    return match.start('userinfo'), match.end('userinfo')


def _secrets(url: str) -> list[str]:
    """The password of `url` as written and decoded, wherever `redacted_url` hides one."""
    text = str.__str__(url)
    if not _SCHEME.search(text):
        return []
    found = [query.group('value') for query in _SECRET_QUERY.finditer(text)]
    span = _userinfo_span(text)
    if span is not None:
        userinfo = text[span[0]:span[1]]
        found += [userinfo, userinfo.partition(':')[2]]
    found += [unquote(secret.replace('+', ' ')) for secret in found] + [
        unquote(secret) for secret in found]
    # Longest first, so that a password containing another is masked whole.
    return sorted({s for s in found if s}, key=len, reverse=True)
