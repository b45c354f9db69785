"""The directory :data:`ft_integrations.nvrx_alias.SHIM_PATH` names (a package only so that it ships in the wheel)."""
