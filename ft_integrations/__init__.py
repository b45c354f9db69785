"""Integrations of the fault tolerance core with the frameworks people train with: Lightning, Megatron-LM."""
