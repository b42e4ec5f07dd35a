"""Reading the pickles inside checkpoints without running any of their code.

``record`` runs as root on files a job wrote, so a pickle in them (DCP's
``.metadata``, ``torch.save``'s ``data.pkl``) is never given to
``pickle.load``. ``SafeUnpickler.find_class`` (Python docs, "Restricting
Globals") never imports anything: each global the pickle names is looked up
in a table of inert stand-ins defined here (plain records, a ``torch.Size``
that is a tuple, a dtype that is its name), so unpickling builds only these
stand-ins, dicts, lists, tuples, strings and numbers. A global outside the
table is refused (``strict``, for DCP's metadata, whose classes are known)
or becomes an ``Opaque`` record of its name that is never called
(``torch.save`` files, which may hold any picklable object besides their
tensors). ``torch`` is not imported.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

from ..errors import CkptTraceError


class UnsafePickleError(CkptTraceError):
    """A pickle names a global outside the allowed table, or is not a pickle this module can read."""


class Record:
    """An inert stand-in for an object of an allowed class: its state, as the pickle gave it."""

    _module = ""
    _name = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.__dict__.update(kwargs)

    def __setstate__(self, state: Any) -> None:
        if (
            isinstance(state, tuple)
            and len(state) == 2
            and (state[0] is None or isinstance(state[0], dict))
            and isinstance(state[1], dict)
        ):
            state = {**(state[0] or {}), **state[1]}  # (dict, slots) of a class with __slots__
        if isinstance(state, dict):
            self.__dict__.update({str(key): value for key, value in state.items()})
        else:
            self.__dict__["state"] = state

    def __repr__(self) -> str:
        return f"{self._module}.{self._name}({self.__dict__})"


def _record_class(module: str, name: str) -> type:
    return type(name, (Record,), {"_module": module, "_name": name})


class Opaque(Record):
    """What a global not in the table becomes (lenient mode): a class of this module standing for it
    (``_module``, ``_name``), so that the pickle may call it (REDUCE), instantiate it (NEWOBJ, as for the
    objects DeepSpeed pickles) and set its state (BUILD); each only records what the pickle gave. Nothing
    of the named global is imported or run."""


def _opaque_class(module: str, name: str) -> type:
    return type("Opaque", (Opaque,), {"_module": module, "_name": name})


class Dtype(str):
    """A torch dtype, as its name (``float32``)."""


class StorageType(str):
    """A torch storage class (``FloatStorage``), as the dtype its elements have."""


class TensorRef:
    """What ``torch._utils._rebuild_tensor_v2`` would build: a view into a storage, not the tensor."""

    def __init__(self, storage: Any, storage_offset: int, size: tuple, stride: tuple, *rest: Any) -> None:
        self.storage = storage
        self.storage_offset = storage_offset
        self.size = tuple(size)
        self.stride = tuple(stride)


class StorageRef:
    """A storage of a ``torch.save`` archive: the persistent id ('storage', type, key, location, numel)."""

    def __init__(self, dtype: str | None, key: str, location: str, numel: int) -> None:
        self.dtype, self.key, self.location, self.numel = dtype, key, location, numel


_DTYPES = (
    "float32",
    "float",
    "float64",
    "double",
    "float16",
    "half",
    "bfloat16",
    "complex64",
    "complex128",
    "uint8",
    "int8",
    "int16",
    "short",
    "int32",
    "int",
    "int64",
    "long",
    "bool",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "uint16",
    "uint32",
    "uint64",
    "cfloat",
    "cdouble",
    "qint8",
    "quint8",
    "qint32",
    "complex32",
    "chalf",
)
_STORAGES = {
    "FloatStorage": "float32",
    "DoubleStorage": "float64",
    "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16",
    "ByteStorage": "uint8",
    "CharStorage": "int8",
    "ShortStorage": "int16",
    "IntStorage": "int32",
    "LongStorage": "int64",
    "BoolStorage": "bool",
    "ComplexFloatStorage": "complex64",
    "ComplexDoubleStorage": "complex128",
    "UntypedStorage": "uint8",
}


def _size(values: Any = ()) -> tuple:
    return tuple(values)


def _layout(name: Any) -> str:
    return str(name)


def _getattr(obj: Any, name: str) -> Any:
    """``builtins.getattr`` as DCP's metadata uses it (an enum member by name): only on our stand-ins."""
    if isinstance(obj, type) and issubclass(obj, Record):
        return f"{obj._name}.{name}"
    raise UnsafePickleError(f"getattr on {type(obj).__name__} refused")


def _rebuild_parameter(data: Any, requires_grad: Any = False, hooks: Any = None, *rest: Any) -> Any:
    return data


class _StateDict(dict):
    """An ``OrderedDict`` as unpickled here: a dict that also takes attributes (a state dict's
    ``_metadata``, set by the pickle's BUILD)."""


def _ordered_dict(*args: Any) -> dict:
    return _StateDict(*args)


_DCP = "torch.distributed.checkpoint.metadata"
_DCP_CLASSES = (
    "Metadata",
    "TensorStorageMetadata",
    "BytesStorageMetadata",
    "ChunkStorageMetadata",
    "TensorProperties",
    "MetadataIndex",
    "StorageMeta",
    "_MEM_FORMAT_ENCODING",
)

ALLOWED: dict[tuple[str, str], Any] = {
    ("torch", "Size"): _size,
    ("torch.serialization", "_get_layout"): _layout,
    ("builtins", "getattr"): _getattr,
    ("collections", "OrderedDict"): _ordered_dict,
    ("pathlib", "PosixPath"): lambda *parts: "/".join(str(p) for p in parts),
    ("pathlib", "WindowsPath"): lambda *parts: "\\".join(str(p) for p in parts),
    ("torch._utils", "_rebuild_tensor_v2"): TensorRef,
    ("torch._utils", "_rebuild_tensor"): TensorRef,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    ("torch.nn.parameter", "Parameter"): _rebuild_parameter,
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): _record_class(
        "torch.distributed.checkpoint.filesystem", "_StorageInfo"
    ),
    ("torch.distributed.checkpoint.metadata", "_StorageInfo"): _record_class(_DCP, "_StorageInfo"),
    **{(_DCP, name): _record_class(_DCP, name) for name in _DCP_CLASSES},
    **{("torch", name): Dtype(name) for name in _DTYPES},
    **{("torch", name): StorageType(dtype) for name, dtype in _STORAGES.items()},
    **{
        ("torch.storage", name): StorageType(_STORAGES.get(name, "uint8"))
        for name in ("UntypedStorage", "TypedStorage")
    },
}


class SafeUnpickler(pickle.Unpickler):
    """An unpickler that builds only the stand-ins of ``ALLOWED`` (strict: any other global is refused;
    lenient: any other global becomes an ``Opaque`` that is never called). ``persistent_load`` maps
    ``torch.save``'s storage ids to ``StorageRef``s."""

    def __init__(self, data: bytes, *, strict: bool = True) -> None:
        super().__init__(io.BytesIO(data))
        self.strict = strict
        self.refused: list[str] = []

    def find_class(self, module: str, name: str) -> Any:  # noqa: D102 (pickle's hook)
        found = ALLOWED.get((module, name))
        if found is not None:
            return found
        if self.strict:
            raise UnsafePickleError(f"refused to load global {module}.{name}: not a known checkpoint metadata class")
        self.refused.append(f"{module}.{name}")
        return _opaque_class(module, name)

    def persistent_load(self, pid: Any) -> Any:  # noqa: D102 (pickle's hook)
        if isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage":
            _, storage_type, key, location, numel = pid
            dtype = str(storage_type) if isinstance(storage_type, StorageType) else None
            return StorageRef(dtype, str(key), str(location), int(numel))
        raise UnsafePickleError(f"unknown persistent id {pid!r:.80}")


def safe_loads(data: bytes, *, strict: bool = True) -> Any:
    """Unpickle ``data`` into inert stand-ins (see the module docstring). Raises UnsafePickleError for a
    refused global or a pickle that does not decode."""
    try:
        return SafeUnpickler(data, strict=strict).load()
    except UnsafePickleError:
        raise
    except Exception as err:  # noqa: BLE001  (a malformed pickle: whatever the opcode loop raised, as one line)
        raise UnsafePickleError(f"not a readable pickle ({type(err).__name__}: {str(err)[:120]})") from None
