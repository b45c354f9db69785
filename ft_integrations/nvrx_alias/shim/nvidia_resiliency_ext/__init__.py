"""Not NVIDIA's package: ft-suite's alias for ``nvidia_resiliency_ext.fault_tolerance`` (see ``ft_integrations.nvrx_alias``).

With NVRx installed too, every other subpackage, and ``__version__``, is NVRx's own
(see :mod:`ft_integrations.nvrx_alias.real_nvrx`).
"""

import sys

from ft_integrations.nvrx_alias.real_nvrx import extend_with_installed

extend_with_installed(sys.modules[__name__])
