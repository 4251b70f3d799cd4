"""The ``ratchet`` command: run a worker, inspect runs and their journals, act on them.

Client commands (``runs``, ``show``, ``events``, ``signal``, ``cancel``, ``dlq``,
``retry``, ``approvals``, ``approve``, ``reject``) need only the database, not the user's
workflows. Every failure is one line, ``error: <message>`` on stderr, with exit code 2
for anything the caller can fix (bad input, an unknown run, a malformed URL) and no
traceback. The reading commands open the database read-only and never create one.

User data (ids, names, payloads, errors) is printed as it is: the console interprets no
markup and no emoji codes, and every user string goes out as a ``Text``, never as markup,
so ``[/bold]`` or ``:child:`` in a step name prints as typed.

One module per verb group (:mod:`ratchet.cli.runs`, :mod:`ratchet.cli.tokens`, ...), the
helpers they share in ``_common`` and ``_format``, and the typer app assembled in
:mod:`ratchet.cli.root`.
"""

from ratchet.cli.root import cli, main

__all__ = ["cli", "main"]
