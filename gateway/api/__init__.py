"""The HTTP layer: the Starlette app, its routes, and the one mapping from domain errors to HTTP."""
