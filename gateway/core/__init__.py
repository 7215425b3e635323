"""Core services: consume, produce, registry, auth, resets. They know neither HTTP nor a broker."""
