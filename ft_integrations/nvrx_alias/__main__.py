"""``python -m ft_integrations.nvrx_alias``: print the directory to put first on ``PYTHONPATH``."""

from ft_integrations.nvrx_alias import SHIM_PATH

print(SHIM_PATH)
