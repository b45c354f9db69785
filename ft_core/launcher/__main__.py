"""``python -m ft_core.launcher``: the same as the ``ft_launcher`` console script."""

import sys

from ft_core.launcher import entry_point

sys.exit(entry_point())
