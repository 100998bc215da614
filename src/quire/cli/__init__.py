"""The ``quire`` command line (click): human-readable output, ``--json`` for scripts."""
