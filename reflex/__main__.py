import sys

from reflex.cli import main

sys.exit(main())
