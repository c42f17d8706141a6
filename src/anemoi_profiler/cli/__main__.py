"""`python -m anemoi_profiler.cli`: the same as the `anemoi-profiler` command."""

import sys

from anemoi_profiler.cli.main import main

sys.exit(main())
