"""How the compiled operator library links the C++ runtime (used by setup.py after the build and by the tests).

The library must use the same shared libstdc++ as libtorch: C++ objects (streams, strings, exceptions, locales)
cross between the two on every call, e.g. a ``std::ostringstream`` of ours written by c10's ``operator<<``.
A second, static copy of libstdc++ inside the library (a compiler set up to link it statically, as
``-static-libstdc++`` does) gives two runtimes with their own locale tables, and the first such call crashes
(seen on the GPU machine: a segfault formatting a shape in the validation of every index-taking op).

Standard library only: setup.py loads this file before the package can be imported.
"""
import os
import struct

_SHT_DYNAMIC = 6
_DT_NULL, _DT_NEEDED = 0, 1


def needed_libraries(path):
    """The DT_NEEDED entries (shared libraries it links) of an ELF64 little-endian file, or None for any
    other file format (then nothing can be said)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:  # ELF, 64-bit, little-endian
        return None
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    needed = []
    for _, sh_type, _, _, offset, size, link, _, _, _ in sections:
        if sh_type != _SHT_DYNAMIC:
            continue
        strtab_offset = sections[link][4]
        for entry in range(offset, offset + size, 16):
            tag, value = struct.unpack_from("<qQ", data, entry)
            if tag == _DT_NULL:
                break
            if tag == _DT_NEEDED:
                start = strtab_offset + value
                needed.append(data[start:data.index(b"\0", start)].decode())
    return needed


def links_shared_libstdcxx(needed):
    """Whether a DT_NEEDED list (needed_libraries) names the shared libstdc++."""
    return any(name.startswith("libstdc++") for name in needed)


def static_libstdcxx_problem(library, torch_library):
    """A message when ``library`` does not link the shared libstdc++ that ``torch_library`` (libc10) links,
    else None (also when either file is missing or not ELF64, or torch links no libstdc++)."""
    if not (os.path.isfile(library) and os.path.isfile(torch_library)):
        return None
    ours, torchs = needed_libraries(library), needed_libraries(torch_library)
    if ours is None or torchs is None or not links_shared_libstdcxx(torchs) or links_shared_libstdcxx(ours):
        return None
    return (f"{library} does not link the shared libstdc++ that torch uses (it links only {', '.join(ours)}): "
            "the compiler linked a static copy of the C++ runtime, and the first C++ object passed between "
            "attn_ops and torch (a stream, a string, an exception) would crash the process. Build with a compiler "
            "that links libstdc++ as a shared library (e.g. CXX=/usr/bin/g++ CC=/usr/bin/gcc "
            "CUDAHOSTCXX=/usr/bin/g++), without -static-libstdc++.")
