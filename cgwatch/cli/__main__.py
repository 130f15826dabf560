"""`python -m cgwatch.cli`: the `cgwatch` command, without the installed script."""

from __future__ import annotations

import sys

from . import main

sys.exit(main())
