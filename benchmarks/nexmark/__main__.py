"""`python -m benchmarks.nexmark ...`: the NEXMark launcher (see `launcher`)."""

import sys

from benchmarks.nexmark.launcher import main

sys.exit(main())
