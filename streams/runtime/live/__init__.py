"""The live runner: the core's stages as a Faust worker, composed of small objects.

Read in the order data flows: :mod:`.app` (the wiring: the agents and what each runs, in one
module), :mod:`.guard` (a record opened at the edge, a stage run on it, a dead letter for what
it could not handle) and :mod:`.sink` (where the decisions go), :mod:`.assembling` (stage 1 in
batches, the common case fed back at once), :mod:`.feedback`, :mod:`.judge` and :mod:`.ledger`
(the ports of the stages with effects), and :mod:`.checkpoint`, the one place that decides when
an input offset may be committed relative to the records sent, the table writes, ``/feedback``
and ``/commit``. Around them: :mod:`.channels` (raw topics in and out), :mod:`.stores` (Faust
tables as the core's stores), :mod:`.progress` (what the watches sample) and :mod:`.worker` (the
process around Faust). Every patch of Faust and aiokafka is in
:mod:`streams.runtime.faust_patches`.
"""
