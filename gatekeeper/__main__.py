import sys

from gatekeeper.cli import main

sys.exit(main())
