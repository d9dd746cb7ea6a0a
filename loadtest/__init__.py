"""Load scenarios for the gateway with baselines measured in the same run (see README.md)."""
