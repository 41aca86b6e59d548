"""The command line, ``python -m cropscale <subcommand>`` (layer 6): :mod:`~cropscale.cli.main`.

:mod:`~cropscale.cli.main` runs the Lightning subcommands through a ``LightningCLI`` and dispatches the analysis
subcommands; :mod:`~cropscale.cli.config` fixes up the parsed configuration, :mod:`~cropscale.cli.folders` resolves
``--ckpt_path`` and run folders, :mod:`~cropscale.cli.exits` turns errors and stop signals into one line and an exit
status, and :mod:`~cropscale.cli.config_errors` names what is wrong in a configuration.
"""
