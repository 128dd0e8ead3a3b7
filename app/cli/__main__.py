"""`python -m app.cli`: the same command as `signalbox-server`."""

import sys

from app.cli import main

sys.exit(main())
