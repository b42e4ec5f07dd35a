"""Storage regression checks: ``baseline`` records replay results with the storage they ran on, ``check`` compares."""
