"""The command-line programs: ``scripts/*.py`` and the ``accel-*`` console scripts both run these."""
