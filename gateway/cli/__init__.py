"""The ``mqgw`` command line: serve, dev, admin client, keys, snapshot, report."""
