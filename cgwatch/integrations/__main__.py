"""`python -m cgwatch.integrations ...`: see `cgwatch.integrations.deepspeed.main`."""

import sys

from cgwatch.integrations.deepspeed import main

sys.exit(main())
