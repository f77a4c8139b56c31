"""raysim: a federated-learning simulator at scale on Ray and PyTorch."""

__version__ = "0.1.0"
