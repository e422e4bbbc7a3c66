"""The CUDA architectures that the compiled library carries device code for, read from the library itself.

The build keeps no list of its own (setup.py passes TORCH_CUDA_ARCH_LIST to nvcc and forgets it), but nvcc
embeds every CUDA translation unit's device code in the library's ``.nv_fatbin`` ELF section: a sequence of
fat binary containers (magic 0xBA55ED50), each a list of entries that are either SASS, machine code for one
architecture (kind 2, reported as ``sm_XY``), or PTX, which the driver compiles for that architecture and
later ones (kind 1, reported as ``compute_XY``). The entry layout used here (kind, header size and payload
size in the first 16 bytes, the architecture as ``10 * major + minor`` at byte 28) was checked against a
library built with ``-gencode arch=compute_90,code=sm_90``. The ``a`` / ``f`` suffixes of architecture-specific
targets (``sm_90a``) are not told apart: they report as the plain architecture.

Standard library only.
"""
import struct

_FATBIN_MAGIC = 0xBA55ED50
_KIND_PTX, _KIND_SASS = 1, 2


def _section(path, wanted):
    """The bytes of the section named ``wanted`` of an ELF64 little-endian file (empty when it has no such
    section), or None when the file is not ELF64 little-endian."""
    with open(path, "rb") as f:
        header = f.read(64)
        if len(header) < 64 or header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
            return None
        shoff, = struct.unpack_from("<Q", header, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", header, 0x3A)
        f.seek(shoff)
        table = f.read(shentsize * shnum)
        # (name offset, type, flags, address, file offset, size, ...) of each section header
        sections = [struct.unpack_from("<IIQQQQ", table, i * shentsize) for i in range(shnum)]
        f.seek(sections[shstrndx][4])
        names = f.read(sections[shstrndx][5])
        for name_offset, _, _, _, offset, size in sections:
            if names[name_offset:names.find(b"\0", name_offset)] == wanted:
                f.seek(offset)
                return f.read(size)
    return b""


def _entries(fatbin):
    """(kind, architecture number) of every entry of every fat binary container in ``fatbin``."""
    position = 0
    while position + 16 <= len(fatbin):
        magic, _, header_size, size = struct.unpack_from("<IHHQ", fatbin, position)
        if magic != _FATBIN_MAGIC:  # alignment padding between containers
            position += 8
            continue
        entry, end = position + header_size, position + header_size + size
        while entry + 32 <= end:
            kind, _, entry_header_size, payload_size = struct.unpack_from("<HHIQ", fatbin, entry)
            arch, = struct.unpack_from("<I", fatbin, entry + 28)
            yield kind, arch
            if entry_header_size == 0:  # a damaged entry: stop rather than loop
                break
            entry += entry_header_size + payload_size
        position = end


def cuda_architectures(library_path):
    """The architectures ``library_path`` carries CUDA code for, e.g. ``["sm_90"]`` or ``["sm_80", "compute_90"]``
    (SASS as ``sm_XY``, PTX as ``compute_XY``; by architecture, SASS first); ``[]`` for a library without device
    code; None when the file is not ELF64 little-endian (another platform's format: nothing can be said)."""
    fatbin = _section(library_path, b".nv_fatbin")
    if fatbin is None:
        return None
    found = {(arch, kind) for kind, arch in _entries(fatbin) if kind in (_KIND_PTX, _KIND_SASS)}
    return [f"{'sm' if kind == _KIND_SASS else 'compute'}_{arch}"
            for arch, kind in sorted(found, key=lambda entry: (entry[0], entry[1] != _KIND_SASS))]
