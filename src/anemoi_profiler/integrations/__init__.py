"""Ways into other training frameworks: `anemoi` (anemoi-training)."""
