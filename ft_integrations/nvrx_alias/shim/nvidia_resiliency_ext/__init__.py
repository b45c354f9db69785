"""Not NVIDIA's package: ft-suite's alias for ``nvidia_resiliency_ext.fault_tolerance`` (see ``ft_integrations.nvrx_alias``)."""
