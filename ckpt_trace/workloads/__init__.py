"""Built-in real checkpoint workloads (DCP, torch.save, safetensors) on GPT-2-shaped state dicts."""

from .engines import ENGINES, run
from .models import MODELS, parameter_count

__all__ = ["ENGINES", "MODELS", "parameter_count", "run"]
