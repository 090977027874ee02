"""Layer 5, entry points: ``pserver-run`` (every rank's main), the launch helpers and launcher
checks."""
