"""The HTTP layer: the only package that knows HTTP statuses and JSON shapes.

- ``app.py``: the app factory (its lifespan opens and closes ``gateway.services``);
- ``access.py``: the one ASGI layer in front (request ids, error answers, metrics, access log);
- ``server.py``: uvicorn's protocol with the connection limits a public server needs;
- ``errors.py``: every error's status and body (exception handlers, ack and unlock outcomes,
  the server's own answers);
- ``http.py``: plumbing every route uses (JSON responses, bodies, query strings, the API key);
- ``routes.py``, ``admin.py``, ``topics.py``: the data, admin and topic routes;
- ``produce_wire.py``, ``consume_wire.py``, ``admin_wire.py``, ``registry_wire.py``: the JSON
  field names in and out (``numbers.py``: what an integer on the wire is).
"""
