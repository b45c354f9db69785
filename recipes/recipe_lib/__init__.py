"""Building blocks of the Hydra recipes: a small model, synthetic data, the config schema."""
