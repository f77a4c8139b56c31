"""Communication: the ``communication:`` section (:mod:`.config`), what an encoded update costs on
the wire. The encodings themselves are a client stage of the update pipeline
(:mod:`raysim.pipeline.compression`)."""
