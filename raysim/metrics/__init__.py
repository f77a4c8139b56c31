"""Run outputs: Parquet logs written as the run goes, and the run summary."""

from raysim.metrics.output import OutputDir
from raysim.metrics.parquet_log import ParquetLog

__all__ = ["OutputDir", "ParquetLog"]
