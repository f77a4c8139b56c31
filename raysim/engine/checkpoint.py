"""Checkpoints: a run's state, saved into its output directory with what its logs held then.

A :class:`Checkpoint` is taken between two server steps. Besides the
:class:`~raysim.engine.run_state.RunState` it records how many rows each Parquet log had (rows
written after it are dropped on resume and produced again, identically), the running totals the
summary needs, and the wall time of the run so far (wall-clock columns go on from it).
``checkpoint.pt`` is written whole under a temporary name, then renamed: a reader sees the previous
checkpoint or the new one, never a part.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass

import torch

from raysim.engine.run_state import RunState
from raysim.errors import ScenarioError
from raysim.output.directory import CHECKPOINT
FORMAT = 3  # 2: the server pipeline's stage states replace format 1's honest_seen and momentum;
# 3: per-client stage state as raysim.pipeline.per_client trees


@dataclass
class Checkpoint:
    """A run between two server steps, with the row counts of its logs (see the module docstring)."""

    state: RunState
    log_rows: dict  # log file name -> rows it held
    tally: dict  # running totals for the summary (plain content, see raysim.engine.run.Tally)
    wall_seconds: float  # wall time of the scheduler when the state was taken
    nbytes: int = 0  # the size of checkpoint.pt once saved or loaded
    digest: str = ""  # the SHA-256 of checkpoint.pt once loaded

    @property
    def version(self) -> int:
        """The server steps taken when the checkpoint was taken."""
        return self.state.version

    def save(self, out) -> int:
        """Write ``checkpoint.pt`` into ``out`` (an OutputDir), replacing the previous one atomically;
        returns its size in bytes."""
        buffer = io.BytesIO()
        torch.save({"format": FORMAT, "state": self.state.content(), "log_rows": self.log_rows,
                    "tally": self.tally, "wall_seconds": self.wall_seconds}, buffer)
        out.write_bytes(CHECKPOINT, buffer.getvalue())
        self.nbytes = buffer.tell()
        return self.nbytes

    @classmethod
    def load(cls, out) -> Checkpoint:
        """Read ``checkpoint.pt`` of ``out`` (FileNotFoundError if there is none)."""
        with out.reader(CHECKPOINT) as stream:
            data = stream.read()
        content = torch.load(io.BytesIO(data), weights_only=True)
        if content.get("format") != FORMAT:
            raise ValueError(f"{out.path(CHECKPOINT)} has checkpoint format {content.get('format')!r}, "
                             f"this raysim reads format {FORMAT}")
        return cls(RunState.from_content(content["state"]), content["log_rows"], content["tally"],
                   content["wall_seconds"], len(data), hashlib.sha256(data).hexdigest())

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
