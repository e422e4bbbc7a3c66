"""What a build of the extension depends on, as one hash: the sources (csrc/, setup.py, build_config.json,
attn_ops/_linkage.py), the torch version, the Python minor version, TORCH_CUDA_ARCH_LIST and the cudnn-frontend
headers the cuDNN backend is built with ($ATTN_OPS_CUDNN_FRONTEND_INCLUDE, else the carried
.cudnn_frontend/include; none: a build without the cuDNN backend).

benchmarks/gpu/prebuild_device.sh writes it next to a library built on this machine for the GPU machine;
gpu_check.sh uses that library only when the hash it computes there is the same (the same sources and the
same torch / Python / architectures), else it builds from source as usual.

    python benchmarks/gpu/build_stamp.py [--arch-list 9.0a]     # prints the hash
"""

import argparse
import glob
import hashlib
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INPUTS = ["csrc/**/*", "setup.py", "build_config.json", "attn_ops/_linkage.py"]


def input_files(root=ROOT):
    """The build's input files, relative to root, sorted."""
    found = set()
    for pattern in INPUTS:
        for path in glob.glob(os.path.join(root, pattern), recursive=True):
            if os.path.isfile(path) and "__pycache__" not in path:
                found.add(os.path.relpath(path, root))
    return sorted(found)


def cudnn_frontend_version(root=ROOT):
    """The version header of the cudnn-frontend headers a build would use, or "none"."""
    include = os.environ.get("ATTN_OPS_CUDNN_FRONTEND_INCLUDE") or os.path.join(root, ".cudnn_frontend", "include")
    path = os.path.join(include, "cudnn_frontend_version.h")
    if not os.path.isfile(path):
        return "none"
    with open(path) as f:
        return f.read()


def build_stamp(arch_list, root=ROOT):
    """sha256 over the input files (names and bytes), torch's version, Python's major.minor, arch_list and the
    cudnn-frontend version."""
    import torch

    digest = hashlib.sha256()
    for rel in input_files(root):
        digest.update(rel.encode() + b"\0")
        with open(os.path.join(root, rel), "rb") as f:
            digest.update(f.read() + b"\0")
    toolchain = f"torch {torch.__version__}; python {sys.version_info[0]}.{sys.version_info[1]}; arch {arch_list}"
    digest.update(toolchain.encode())
    digest.update(b"\0cudnn-frontend " + cudnn_frontend_version(root).encode())
    return digest.hexdigest()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch-list", default=os.environ.get("TORCH_CUDA_ARCH_LIST", "9.0"))
    parser.add_argument("--root", default=ROOT, help="the source tree (default: this checkout)")
    args = parser.parse_args()
    print(build_stamp(args.arch_list, args.root))


if __name__ == "__main__":
    main()
