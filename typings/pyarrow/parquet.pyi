# pyarrow is a compiled (Cython) library that ships no type information, and pyarrow.compute builds its
# functions at import (compute.py, _make_global_functions), so no checker can see them. These stubs say
# that every name exists and is of unknown type (PEP 484: a stub module's __getattr__), which is what a
# checker infers for the rest of pyarrow anyway.
from typing import Any

def __getattr__(name: str) -> Any: ...
