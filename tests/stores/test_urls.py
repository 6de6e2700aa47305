"""`redacted_url` and `scrub`: passwords never shown (the one redaction helper of the
runner: store URLs, Redis sink and source URLs, `SecretUrl`, command-line flags)."""

from __future__ import annotations

import pytest

from beam_streams_runner.options import SecretUrl
from beam_streams_runner.stores import redacted_url
from beam_streams_runner.stores.urls import scrub


@pytest.mark.parametrize('url, redacted', [
    # The user information: the user name is kept, the password hidden.
    ('redis://:p%40ss@h:1/0', 'redis://:***@h:1/0'),
    ('redis://u:pw@h:1/2', 'redis://u:***@h:1/2'),
    ('redis://user:pw@h:1/0', 'redis://user:***@h:1/0'),
    ('redis://pw@h:1/0', 'redis://***@h:1/0'),  # a password written as the user name
    ('redis://pw@h/0', 'redis://***@h/0'),
    ('redis://:ab/cd@h:1/0', 'redis://:***@h:1/0'),  # an unencoded '/' in the password
    ('redis://:p@ss:w%40rd@h/1', 'redis://:***@h/1'),  # an unencoded '@' in the password
    ('rediss://:a?b#c@h', 'rediss://:***@h'),
    ('redis://u/x:pw@h', 'redis://***@h'),  # a user name with '/': hidden whole
    ('REDIS://u:pw@h', 'REDIS://u:***@h'),
    # rediss (TLS) and unix sockets.
    ('rediss://h:6380/1', 'rediss://h:6380/1'),
    ('rediss://u:pw@h:6380/1', 'rediss://u:***@h:6380/1'),
    ('unix:///s.sock?db=1&password=pw', 'unix:///s.sock?db=1&password=***'),
    ('unix://u:pw@/s.sock?db=1', 'unix://u:***@/s.sock?db=1'),
    ('unix:/s.sock?password=pw', 'unix:/s.sock?password=***'),  # no '//'
    # Query arguments whose name holds 'pass', in any case.
    ('redis://h:1/0?password=pw&db=1', 'redis://h:1/0?password=***&db=1'),
    ('rediss://h?ssl=1&PassWord=pw#x', 'rediss://h?ssl=1&PassWord=***#x'),
    ('redis://u:pw@h/0?password=pw2', 'redis://u:***@h/0?password=***'),
    ('redis://h/0?sentinel_password=pw', 'redis://h/0?sentinel_password=***'),
    # File URLs: an '@' in the path is no user information.
    ('file://u:pw@host/x@y', 'file://u:***@host/x@y'),
    ('file:///var/a@b', 'file:///var/a@b'),
    # A URL inside a text, such as a command-line flag.
    ('--checkpoint-store=redis://:pw@h', '--checkpoint-store=redis://:***@h'),
    ('--checkpoint_store=redis://h/0?password=pw', '--checkpoint_store=redis://h/0?password=***'),
    # Not URLs: as they are.
    ('/dir?password=kept', '/dir?password=kept'),  # a path, not a URL
    ('/var/ckpt', '/var/ckpt'),
    ('memory://', 'memory://'),
])
def test_redacted_url(url, redacted):
    assert redacted_url(url) == redacted


def test_a_secret_url_is_redacted_by_its_content():
    url = SecretUrl('redis://:pw@h/0')
    assert str(url) == 'redis://:***@h/0'  # str() is itself redacted...
    assert redacted_url(url) == 'redis://:***@h/0'  # ...and the helper reads the content


@pytest.mark.parametrize('url, secret', [
    ('redis://:p%40ss@h/0', 'p@ss'),
    ('redis://:ab/cd@h/0', 'ab/cd'),
    ('redis://pw-only@h/0', 'pw-only'),
    ('unix:///s.sock?password=s%2Bcret', 's+cret'),
    ('rediss://h/0?PASSWORD=a+b', 'a b'),
])
def test_scrub_masks_the_password_as_written_and_decoded(url, secret):
    text = f'client error for {url}: auth failed with {secret!r}'
    scrubbed = scrub(text, url)
    assert secret not in scrubbed and '***' in scrubbed
    assert 'client error for' in scrubbed


def test_scrub_leaves_a_url_without_password_alone():
    assert scrub('error at redis://h:1/0', 'redis://h:1/0') == 'error at redis://h:1/0'
