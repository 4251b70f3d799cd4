"""``python -m ratchet.cli``: the ``ratchet`` command."""

from ratchet.cli.root import main

main()
