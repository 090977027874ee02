"""Layer 1, pure: what a run is before it starts (the typed config, the layout of ranks and blocks,
node limits, fault-injection plans, unused keys)."""
