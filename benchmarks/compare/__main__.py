"""`python -m benchmarks.compare`: see `benchmarks.compare.main`."""

import sys

from benchmarks.compare.main import main

sys.exit(main())
