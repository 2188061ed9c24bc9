"""The ``kl`` command line, one module per audience: ``operator`` (the service's own commands), ``reads``
(the client's read commands), ``changes`` (plan, apply, recover, abort) and ``drift``; ``support`` holds what
they share and ``entry`` the parser and the exit codes.

Client commands find the server and state from the configuration directory's ``backend "http"`` block
(``-C DIR``, default ``.``; or --address/--state/--token, KL_ADDRESS/KL_STATE/KL_TOKEN) and talk to it only
through ``runner.core.engine_client``. Nothing here imports the bot's jobs or RQ until ``kl worker`` runs.
"""

from runner.cli.entry import build_parser, main

__all__ = ["build_parser", "main"]
