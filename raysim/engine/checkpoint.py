"""Checkpoints: a run's state, saved into its output directory with what its logs held then.

A :class:`Checkpoint` is taken between two server steps. Besides the
:class:`~raysim.engine.run_state.RunState` it records how many rows each Parquet log had (rows
written after it are dropped on resume and produced again, identically), the running totals the
summary needs, and the wall time of the run so far (wall-clock columns go on from it).
``checkpoint.pt`` is written whole under a temporary name, then renamed: a reader sees the previous
checkpoint or the new one, never a part. It is bound to itself and to its run: its content travels as
bytes beside their SHA-256 (a changed byte is refused, not read as another state), with the keys of
the scenario that decide the run's results (:func:`raysim.scenario.schema.result_keys`), so that
a resume of an edited scenario is refused.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass, field

import torch

from raysim.engine.run_state import RunState
from raysim.errors import ScenarioError
from raysim.output.directory import CHECKPOINT
FORMAT = 4  # 2: the server pipeline's stage states replace format 1's honest_seen and momentum;
# 3: per-client stage state as raysim.pipeline.per_client trees; 4: the content as bytes with their SHA-256,
# and the scenario's result keys


@dataclass
class Checkpoint:
    """A run between two server steps, with the row counts of its logs (see the module docstring)."""

    state: RunState
    log_rows: dict  # log file name -> rows it held
    tally: dict  # running totals for the summary (plain content, see raysim.engine.run.Tally)
    wall_seconds: float  # wall time of the scheduler when the state was taken
    scenario: dict = field(default_factory=dict)  # the scenario's result keys (raysim.scenario.schema.result_keys)
    nbytes: int = 0  # the size of checkpoint.pt once saved or loaded
    digest: str = ""  # the SHA-256 of checkpoint.pt once loaded

    @property
    def version(self) -> int:
        """The server steps taken when the checkpoint was taken."""
        return self.state.version

    def save(self, out) -> int:
        """Write ``checkpoint.pt`` into ``out`` (an OutputDir), replacing the previous one atomically;
        returns its size in bytes."""
        body = io.BytesIO()
        torch.save({"state": self.state.content(), "log_rows": self.log_rows, "tally": self.tally,
                    "wall_seconds": self.wall_seconds, "scenario": self.scenario}, body)
        body = body.getvalue()
        buffer = io.BytesIO()
        torch.save({"format": FORMAT, "body": body, "sha256": hashlib.sha256(body).hexdigest()}, buffer)
        out.write_bytes(CHECKPOINT, buffer.getvalue())
        self.nbytes = buffer.tell()
        return self.nbytes

    @classmethod
    def load(cls, out) -> Checkpoint:
        """Read ``checkpoint.pt`` of ``out`` (FileNotFoundError if there is none)."""
        with out.reader(CHECKPOINT) as stream:
            data = stream.read()
        outer = torch.load(io.BytesIO(data), weights_only=True)
        if not isinstance(outer, dict) or outer.get("format") != FORMAT:
            found = outer.get("format") if isinstance(outer, dict) else None
            raise ValueError(f"{out.path(CHECKPOINT)} has checkpoint format {found!r}, this raysim reads format "
                             f"{FORMAT}")
        if hashlib.sha256(outer["body"]).hexdigest() != outer["sha256"]:
            raise ValueError(f"{out.path(CHECKPOINT)} does not match its own SHA-256: it was changed or damaged "
                             "after it was written")
        content = torch.load(io.BytesIO(outer["body"]), weights_only=True)
        return cls(RunState.from_content(content["state"]), content["log_rows"], content["tally"],
                   content["wall_seconds"], content["scenario"], len(data), hashlib.sha256(data).hexdigest())

    def check_still_in(self, out) -> None:
        """Raise ScenarioError unless ``out`` still holds the checkpoint.pt this was loaded from:
        another run may have written into the directory between that read and the resumed run's
        claim of the directory (call it once the directory is claimed)."""
        try:
            with out.reader(CHECKPOINT) as stream:
                now = hashlib.sha256(stream.read()).hexdigest()
        except FileNotFoundError:
            now = None
        if now != self.digest:
            raise ScenarioError("run_dir", out.root, "a directory no other run wrote into while this one was being "
                                f"resumed (its {CHECKPOINT} has {'gone' if now is None else 'changed'}: "
                                "see what it holds now before resuming it again)")
