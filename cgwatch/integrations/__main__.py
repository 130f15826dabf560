"""`python -m cgwatch.integrations ...`: see `cgwatch.integrations.switches.main`."""

import sys

from cgwatch.integrations.switches import main

sys.exit(main())
