"""Entry point: `python -m bench` from the repository root."""

from bench.run import main

raise SystemExit(main())
