"""`python -m cgwatch`: the `cgwatch` command (cgwatch.cli), without the installed script."""

from __future__ import annotations

import sys

from .cli import main

sys.exit(main())
