"""The server step as one pipeline of stages, and the seam after a client's local loop.

A server step takes the updates of a round, a FedBuff buffer or one FedAsync completion through
the server's update stages in order (:mod:`.stage`): client momentum (:mod:`.momentum`), the
Byzantine attack (:mod:`.attack`); then the algorithm's aggregation rule, the aggregate stages
(between the sum and the server optimizer: where central DP's noise and secure aggregation's
modular sum go) and the algorithm's server optimizer (:class:`~.server.ServerPipeline`). Each
stage is a pure ``(init, update)`` pair in the style of optax's transforms; its state is plain
content kept in the run state (per-client state as a :mod:`.per_client` tree).
On the client, after the algorithm's local loop, a task's updates go through the client stages
(:mod:`.client`) before upload. A stage declares how it changes the bytes of an upload, and the
system model times the upload from what the stages declare. :func:`~.build.server_pipeline` and
:func:`~.build.client_stages` build both from the scenario.
"""
