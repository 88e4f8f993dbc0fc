import sys

from rocmport.cli import main

sys.exit(main())
