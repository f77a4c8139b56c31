"""The client's stages: what a client does to its update after the local loop, before upload.

A client stage is pure like a server stage (:mod:`.stage`), over a task's results:
``update(updates, ctx, payloads)`` gives the task's updates as the clients upload them (``payloads``:
what each client received, in the task's order), drawing any random number from the task's
per-client streams ``ctx.rngs`` (so a client's upload does not depend on
where or with whom it ran). A stage that keeps state per client (an error-feedback residual)
keeps it as the algorithm's client state is kept: read with ``ctx.kept``, returned among
``updates.states``, stored in the run state between the client's visits. ``upload_bytes``
declares the bytes the stage's encoding uploads; a stage whose encoding's size depends on the
update (``sizes_by_content``: QSGD with Elias coding) also puts each upload's exact bytes among
``updates.diagnostics`` (``ENCODED_BYTES``), and the synchronous engine computes a round's updates
before it times them. ``diagnostics`` names the numbers per client it puts among
``updates.diagnostics``, each logged in an events.parquet column.
"""

from __future__ import annotations

from raysim.algorithms import ClientContext, ClientUpdates


ENCODED_BYTES = "encoded_bytes"  # the diagnostic holding each upload's bytes, from a stage that sizes by content


class ClientStage:
    """A stage a task's updates go through on the client host (see the module docstring)."""

    name = "client_stage"
    diagnostics: tuple = ()
    sizes_by_content = False  # whether an upload's size depends on the update (then in diagnostics[ENCODED_BYTES])
    keeps: tuple = ()  # the per-client states it keeps between a client's visits (among updates.states)

    def update(self, updates: ClientUpdates, ctx: ClientContext, payloads: list) -> ClientUpdates:
        """The task's updates as uploaded."""
        raise NotImplementedError

    def upload_bytes(self, nbytes: int, values: int) -> int:
        """The bytes of an upload of ``nbytes`` (``values`` numbers) once this stage has acted (the
        same, by default)."""
        return nbytes


def run_client_stages(stages: tuple, updates: ClientUpdates, ctx: ClientContext, payloads: list) -> ClientUpdates:
    """``updates`` through ``stages`` in order (``payloads``: what each client received)."""
    for stage in stages:
        updates = stage.update(updates, ctx, payloads)
    return updates
