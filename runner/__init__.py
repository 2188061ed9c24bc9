"""Kilolock's client side: ``runner.core`` (plan, apply, refresh and drift against the engine), and the two
things that drive it, the ``kl`` command line (``runner.cli``) and the GitHub bot (``runner.bot``)."""
