import sys

from porter.calibration.command import main

sys.exit(main())
