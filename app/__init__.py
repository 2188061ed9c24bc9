"""Kilolock service: the Postgres store, the domain rules and the Flask lanes.

Importing ``app`` imports nothing else: Flask is only loaded by ``app.web``, so the CLI, the
workers and the pure tests can use ``app.config``, ``app.errors`` and ``app.store`` without it.
"""
