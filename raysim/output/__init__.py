"""Run outputs: Parquet logs written as the run goes, and the run summary."""

from raysim.output.directory import OutputDir
from raysim.output.parquet_log import ParquetLog

__all__ = ["OutputDir", "ParquetLog"]
