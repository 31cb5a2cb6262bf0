import sys

from regional.cli import main

sys.exit(main())
