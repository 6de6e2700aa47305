"""Build script: metadata lives in setup.cfg; only the package list is computed here.

`translators/` and `state/` are top-level folders installed as
`beam_streams_runner.translators` and `beam_streams_runner.state` (setup.cfg
`package_dir`). setup.cfg's `find:` cannot rename packages, so the list is built
here: every package under beam_streams_runner/, plus every package under
translators/ and state/ with the beam_streams_runner. prefix.
"""

from setuptools import find_packages, setup

REMAPPED = ('translators', 'state')

packages = find_packages(include=['beam_streams_runner', 'beam_streams_runner.*'])
for top in REMAPPED:
    packages += [f'beam_streams_runner.{name}'
                 for name in find_packages(include=[top, f'{top}.*'])]

setup(packages=sorted(packages))
