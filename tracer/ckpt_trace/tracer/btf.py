"""Kernel struct layouts from BTF, never from headers: member offsets and enum values of the running kernel.

The eBPF program reads kernel memory (``bpf_probe_read_kernel``) at offsets
computed here from ``/sys/kernel/btf/vmlinux``, the running kernel's own type
information, because Debian's headers (6.1) need not match the running
kernel (6.18 here) and kprobes/CO-RE relocations are not available to bcc on
the target machines. Format: Documentation/bpf/btf.rst ("BTF Type and
String Encoding").

``Btf(path).offset("io_kiocb", "cqe", "fd")`` walks a member path, anonymous
unions and structs included, and returns the byte offset; ``enum_value``
returns an enumerator. Both raise ``BtfMissing`` (with what was missing) so
the tracer can say at start what it cannot see and fall back.
"""

from __future__ import annotations

import struct
from functools import lru_cache
from pathlib import Path

VMLINUX = Path("/sys/kernel/btf/vmlinux")
MAGIC = 0xEB9F

# BTF_KIND_*: how many bytes follow the 12-byte btf_type, and per member.
_INT, _PTR, _ARRAY, _STRUCT, _UNION, _ENUM, _FWD, _TYPEDEF = 1, 2, 3, 4, 5, 6, 7, 8
_VOLATILE, _CONST, _RESTRICT, _FUNC, _FUNC_PROTO, _VAR, _DATASEC, _FLOAT = 9, 10, 11, 12, 13, 14, 15, 16
_DECL_TAG, _TYPE_TAG, _ENUM64 = 17, 18, 19
_EXTRA = {_INT: 4, _ARRAY: 12, _VAR: 4, _DECL_TAG: 4}
_PER_MEMBER = {_STRUCT: 12, _UNION: 12, _ENUM: 8, _FUNC_PROTO: 8, _DATASEC: 12, _ENUM64: 12}
_QUALIFIERS = {_TYPEDEF, _VOLATILE, _CONST, _RESTRICT, _TYPE_TAG}


class BtfMissing(LookupError):
    """A type, member or enumerator the tracer needs is not in this kernel's BTF (or BTF is unavailable)."""


class Btf:
    """The parsed type section of a raw BTF file (``/sys/kernel/btf/vmlinux``)."""

    def __init__(self, path: str | Path = VMLINUX) -> None:
        try:
            data = Path(path).read_bytes()
        except OSError as err:
            raise BtfMissing(f"no kernel BTF at {path} ({err.strerror})") from None
        magic, _version, _flags, hdr_len, type_off, type_len, str_off, str_len = struct.unpack_from("<HBBIIIII", data)
        if magic != MAGIC:
            raise BtfMissing(f"{path} is not raw BTF")
        self._strings = data[hdr_len + str_off : hdr_len + str_off + str_len]
        self._types: list[tuple[int, int, int, int]] = [(0, 0, 0, 0)]  # (kind, name_off, size_or_type, position)
        self._data = data
        self._by_name: dict[tuple[int, str], list[int]] = {}
        self._enums: list[int] = []  # every enum, anonymous ones too (REQ_F_*_BIT are anonymous)
        position, end = hdr_len + type_off, hdr_len + type_off + type_len
        while position < end:
            name_off, info, size_or_type = struct.unpack_from("<III", data, position)
            kind, vlen = (info >> 24) & 0x1F, info & 0xFFFF
            type_id = len(self._types)
            self._types.append((kind | ((info >> 31) << 8), name_off, size_or_type, position + 12))
            if kind in (_STRUCT, _UNION) and name_off:
                self._by_name.setdefault((kind, self._name(name_off)), []).append(type_id)
            elif kind in (_ENUM, _ENUM64):
                self._enums.append(type_id)
            position += 12 + _EXTRA.get(kind, 0) + _PER_MEMBER.get(kind, 0) * vlen

    def _name(self, offset: int) -> str:
        return self._strings[offset : self._strings.index(b"\0", offset)].decode()

    def _resolve(self, type_id: int) -> int:
        while self._types[type_id][0] & 0xFF in _QUALIFIERS:
            type_id = self._types[type_id][2]
        return type_id

    def _members(self, type_id: int):
        """(name, type id, bit offset) of a struct's or union's members."""
        kind_bits, _, _, position = self._types[type_id]
        kind_flag = kind_bits >> 8
        count = struct.unpack_from("<I", self._data, position - 8)[0] & 0xFFFF
        for index in range(count):
            name_off, member_type, offset = struct.unpack_from("<III", self._data, position + 12 * index)
            yield self._name(name_off), member_type, (offset & 0xFFFFFF) if kind_flag else offset

    def struct_id(self, name: str) -> int:
        """The type id of ``struct name`` (or ``union name``) with members. Raises BtfMissing."""
        for kind in (_STRUCT, _UNION):
            for type_id in self._by_name.get((kind, name), []):
                if struct.unpack_from("<I", self._data, self._types[type_id][3] - 8)[0] & 0xFFFF:
                    return type_id
        raise BtfMissing(f"struct {name} is not in this kernel's BTF")

    def _find(self, type_id: int, member: str) -> tuple[int, int] | None:
        """(bit offset, type id) of ``member`` in the struct/union ``type_id``, searching anonymous members."""
        for name, member_type, bit_offset in self._members(type_id):
            if name == member:
                return bit_offset, member_type
            if not name:
                inner = self._resolve(member_type)
                if self._types[inner][0] & 0xFF in (_STRUCT, _UNION):
                    found = self._find(inner, member)
                    if found is not None:
                        return bit_offset + found[0], found[1]
        return None

    def offset(self, struct_name: str, *members: str) -> int:
        """Byte offset of ``struct_name.members[0].members[1]...``. Raises BtfMissing."""
        type_id, total_bits = self.struct_id(struct_name), 0
        for member in members:
            found = self._find(self._resolve(type_id), member)
            if found is None:
                raise BtfMissing(f"struct {struct_name} has no member {'.'.join(members)} in this kernel")
            total_bits += found[0]
            type_id = found[1]
        if total_bits % 8:
            raise BtfMissing(f"{struct_name}.{'.'.join(members)} is a bit field")
        return total_bits // 8

    def member_size(self, struct_name: str, *members: str) -> int:
        """sizeof ``struct_name.members...`` (an integer, enum or pointer member). Raises BtfMissing."""
        type_id = self.struct_id(struct_name)
        for member in members:
            found = self._find(self._resolve(type_id), member)
            if found is None:
                raise BtfMissing(f"struct {struct_name} has no member {'.'.join(members)} in this kernel")
            type_id = found[1]
        kind, _, size, _ = self._types[self._resolve(type_id)]
        if kind & 0xFF == _PTR:
            return 8
        return size

    def size(self, struct_name: str) -> int:
        """sizeof(struct ``struct_name``)."""
        return self._types[self.struct_id(struct_name)][2]

    def enum_value(self, enumerator: str) -> int:
        """The value of enumerator ``enumerator`` (any enum). Raises BtfMissing."""
        for type_id in self._enums:
            kind_bits, _, _, position = self._types[type_id]
            count = struct.unpack_from("<I", self._data, position - 8)[0] & 0xFFFF
            wide = kind_bits & 0xFF == _ENUM64
            for index in range(count):
                if wide:
                    name_off, low, high = struct.unpack_from("<III", self._data, position + 12 * index)
                    value = low | (high << 32)
                else:
                    name_off, value = struct.unpack_from("<Ii", self._data, position + 8 * index)
                if self._name(name_off) == enumerator:
                    return value
        raise BtfMissing(f"enumerator {enumerator} is not in this kernel's BTF")


@lru_cache(maxsize=1)
def kernel() -> Btf:
    """The running kernel's BTF (parsed once). Raises BtfMissing."""
    return Btf(VMLINUX)
