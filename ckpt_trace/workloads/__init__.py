"""Built-in real checkpoint workloads (DCP, torch.save, safetensors, ...) on GPT-2-shaped state dicts: one
module per workload in ``builtin`` (its table), what they share in ``engines``."""

from .builtin import names, run
from .models import MODELS, parameter_count

#: The built-in workloads' names, in the CLI's order (``builtin.table()``).
ENGINES = names()

__all__ = ["ENGINES", "MODELS", "parameter_count", "run"]
