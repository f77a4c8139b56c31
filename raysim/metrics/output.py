"""The run's output directory on any filesystem pyarrow understands: a local path, a shared
filesystem path, or a URI such as ``s3://bucket/runs/x``, ``gs://…`` or ``file:///…``."""

from __future__ import annotations

import io
import os

import pyarrow.fs as pafs

from raysim.errors import ScenarioError


class OutputDir:
    """A directory ``root`` on filesystem ``fs``; files are written whole (text, bytes, Parquet)."""

    def __init__(self, fs: pafs.FileSystem, root: str, create: bool = True):
        self.fs, self.root = fs, root.rstrip("/")
        if create:
            self.fs.create_dir(self.root, recursive=True)

    @staticmethod
    def open(location: str, create: bool = True) -> "OutputDir":
        """The directory at ``location`` (``output.dir``), created if missing (and ``create``)."""
        try:
            if "://" in location:
                fs, root = pafs.FileSystem.from_uri(location)
            else:
                fs, root = pafs.LocalFileSystem(), os.path.abspath(location)
            return OutputDir(fs, root, create)
        except (OSError, ValueError, TypeError) as exc:  # pyarrow's ArrowInvalid is a ValueError
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ScenarioError("output.dir", location, "a writable local path or a URI that pyarrow.fs "
                                f"understands (file://, s3://, gs://, hdfs://): {first}") from None

    def path(self, name: str) -> str:
        """The full path of file ``name`` inside the directory."""
        return f"{self.root}/{name}"

    def write_bytes(self, name: str, data: bytes) -> None:
        with self.fs.open_output_stream(self.path(name)) as stream:
            stream.write(data)

    def reader(self, name: str):
        """A readable binary file object for file ``name`` (FileNotFoundError if missing)."""
        return self.fs.open_input_file(self.path(name))

    def read_bytes(self, name: str) -> bytes:
        with self.reader(name) as stream:
            return stream.read()

    def read_table(self, name: str):
        """A Parquet file of the directory as a pyarrow Table."""
        import pyarrow.parquet as pq

        return pq.read_table(self.path(name), filesystem=self.fs)

    def write_text(self, name: str, text: str) -> None:
        self.write_bytes(name, text.encode())

    def save_torch(self, name: str, obj) -> None:
        """``torch.save`` into the directory."""
        import torch

        buffer = io.BytesIO()
        torch.save(obj, buffer)
        self.write_bytes(name, buffer.getvalue())
