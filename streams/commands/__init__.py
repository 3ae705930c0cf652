"""The bodies of the ``trajstream`` commands, by area: :mod:`.local` (the workshop),
:mod:`.pipeline` (topics, worker, replay, settings), :mod:`.capture` (the ingress) and
:mod:`.operate` (audit, status, commits). :mod:`streams.cli` builds the parser and dispatches to
them; each takes the parsed arguments and the settings and returns the exit code.

May import: anything in the package but :mod:`streams.cli`.
"""
