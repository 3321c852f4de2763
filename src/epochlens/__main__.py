import sys

from epochlens.cli import main

sys.exit(main())
