"""`vigil` subcommands beyond the monitor's, one module each.

A module names the group it joins (``GROUP``: None for a top-level command, or "verify" or
"certify") and adds its parser in ``register(subparsers)``, setting ``handler`` to a function
``(args) -> exit code`` that prints its own output. A ``ValueError`` from the handler becomes
``vigil ...: error: <message>`` and exit code 2.
"""
