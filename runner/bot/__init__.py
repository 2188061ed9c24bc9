"""The GitHub bot, run by RQ workers (``kl worker``): one of the two paths over the Terraform core (the
other is the ``kl`` CLI, and the two never import each other).

- ``jobs``: the RQ entry points and the kind → (run, deliver) table; ``context``: one job's resources.
- ``pulls``, ``merges``: what each kind of job computes and posts; ``holds``: apply before merge.
- ``flow``: the footprint, plan preview and apply of a change, on a checkout (``runner.core.filescoped``).
- ``config``: ``.kilolock.yml`` read raw, then validated; ``requirements``: the comment-apply gate.
- ``outcomes``, ``results``: what jobs store; ``view``: what a comment shows, read from the store.
- ``render``, ``holdtext``, ``drifttext``: the Markdown; ``drift``: the scheduled drift check.
- ``github``: the only GitHub API client.
"""
