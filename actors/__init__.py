"""Ray actors: ClientActor (hosts many virtual clients on a CPU or GPU share) and the Ray runtime.

This package is the only place, with the CLI's runtime selection, that imports ``ray``.
"""
