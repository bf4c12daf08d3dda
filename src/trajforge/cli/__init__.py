"""The ``trajforge`` command: one module per command group, each exposing ``register(app)``."""
