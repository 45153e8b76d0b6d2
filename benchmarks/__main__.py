"""`python -m benchmarks`: see `benchmarks/run.py` and `benchmarks/README.md`."""

import sys

from benchmarks.run import main

sys.exit(main())
