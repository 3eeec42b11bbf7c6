"""`python3 -m porter ...` is `porter ...`."""

import sys

from porter.cli import main

sys.exit(main())
