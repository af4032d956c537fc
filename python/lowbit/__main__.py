"""`python -m lowbit ...`: the lowbit command line (see lowbit.cli)."""

from .cli import main

raise SystemExit(main())
