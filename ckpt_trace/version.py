"""The ckpt-trace release. ``ckpt_trace`` is a PEP 420 namespace spread over the top-level folders
(``formats/``, ``iolayer/``, ``tracer/``, ``replayer/`` and ``ckpt_trace/`` itself), so it has no
``__init__``: the version lives here."""

__version__ = "0.2.0"
