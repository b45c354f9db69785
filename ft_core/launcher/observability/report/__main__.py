"""``python -m ft_core.launcher.observability.report LOG_DIR...``: the same as ``ft_launcher report``."""

import sys

from ft_core.launcher.observability.report.command import main

sys.exit(main())
