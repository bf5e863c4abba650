import sys

from polykernels_build.cli import main

sys.exit(main())
