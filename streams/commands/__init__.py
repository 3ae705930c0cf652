"""The bodies of the ``trajstream`` commands, by area: :mod:`.local` (the workshop),
:mod:`.pipeline` (topics, worker, replay, settings), :mod:`.capture` (the ingress) and
:mod:`.operate` (audit, status, commits). Beside each body, its ``add_<command>`` adds the
subcommand and its options (the one place they are written; those that set a setting come from
the setting's field, :func:`streams.cli_support.setting_option`); :mod:`streams.cli` builds the
parser from them and dispatches. Each body takes the parsed arguments and the settings (with the
options' settings applied) and returns the exit code.

May import: anything in the package but :mod:`streams.cli`.
"""
