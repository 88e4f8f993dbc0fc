"""`python -m rocmport`: the same command line as `rocmport`."""

import sys

from rocmport.cli import main

sys.exit(main())
