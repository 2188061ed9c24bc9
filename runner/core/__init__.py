"""The core both the command line (``runner.cli``) and the GitHub bot (``runner.bot``) run: plan, apply,
refresh and drift against the engine, over a workspace and a Terraform process. It never imports the CLI or
the bot."""
