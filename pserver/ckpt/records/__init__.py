"""Layer 1, pure: each stateful owner's checkpoint record (what it saves, its checks, how it is
restored)."""
