"""Build attn_ops._C, the operator library, with torch.utils.cpp_extension.

CUDA sources (csrc/**/cuda/*.cu) are compiled when a CUDA toolkit is found, unless ATTN_OPS_CUDA=0; the
CUDA architectures come from TORCH_CUDA_ARCH_LIST (default: build_config.json, 9.0, the H100: a build
machine may have no GPU to detect). The C++ standard and the nvcc flags are build_config.json's too (the
file CMakeLists.txt reads). Install with:  pip install --no-build-isolation -e .
"""
import glob
import importlib.util
import json
import os
import shutil
import sys

from setuptools import find_packages, setup

ROOT = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(ROOT, "build_config.json")) as _f:
    BUILD_CONFIG = json.load(_f)  # shared with CMakeLists.txt
STD_FLAG = f"-std=c++{BUILD_CONFIG['cxx_standard']}"


def find_cuda_home():
    """The CUDA toolkit root: $CUDA_HOME / $CUDA_PATH, else the toolkit of the nvcc on PATH.

    torch's own guess is the parent of nvcc's directory, which is wrong when /usr/local/bin/nvcc is a
    wrapper script around /usr/local/cuda-X.Y/bin/nvcc; so prefer a directory that has the runtime headers.
    """
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            return os.environ[env]
    candidates = []
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    candidates += ["/usr/local/cuda"] + sorted(glob.glob("/usr/local/cuda-*"), reverse=True)
    for root in candidates:
        if os.path.exists(os.path.join(root, "include", "cuda_runtime_api.h")):
            return root
    return None


def want_cuda():
    """ATTN_OPS_CUDA (0 / false / off: no), else whether a CUDA toolkit is found."""
    setting = os.environ.get("ATTN_OPS_CUDA")
    if setting is not None:
        return setting not in ("0", "", "false", "False", "OFF", "off")
    return find_cuda_home() is not None


if want_cuda() and find_cuda_home():
    os.environ.setdefault("CUDA_HOME", find_cuda_home())  # read by torch.utils.cpp_extension at import

from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension  # noqa: E402


def cuda_library_includes():
    """ATen's CUDA headers include cuBLAS / cuSPARSE headers, which a minimal toolkit may lack while the pip
    CUDA packages that came with torch (site-packages/nvidia/cu*/include) have them."""
    home = os.environ.get("CUDA_HOME", "")
    if os.path.exists(os.path.join(home, "include", "cusparse.h")):
        return []
    import torch

    # torch's own site-packages first, then the others (a venv over the system's packages)
    sites = [os.path.dirname(os.path.dirname(torch.__file__))] + [p for p in sys.path if os.path.isdir(p)]
    return [d for site in sites for d in sorted(glob.glob(os.path.join(site, "nvidia", "cu*", "include")))
            if os.path.exists(os.path.join(d, "cusparse.h"))][:1]


def cudnn_backend_includes():
    """The include dirs of the cuDNN attention backend (csrc/attention/cuda/cudnn_*), or [] without them (the build
    then routes every call to attn_ops' own kernels): cudnn-frontend's headers ($ATTN_OPS_CUDNN_FRONTEND_INCLUDE,
    else the nvidia-cudnn-frontend package's site-packages/include, installed with --no-deps) and cuDNN's
    (nvidia-cudnn-cu13, which torch's CUDA wheels require)."""
    sites = [p for p in sys.path if os.path.isdir(p)]
    frontend = [os.environ["ATTN_OPS_CUDNN_FRONTEND_INCLUDE"]] if os.environ.get("ATTN_OPS_CUDNN_FRONTEND_INCLUDE") \
        else [os.path.join(site, "include") for site in sites]
    frontend = [d for d in frontend if os.path.exists(os.path.join(d, "cudnn_frontend.h"))][:1]
    cudnn = [d for d in (os.path.join(site, "nvidia", "cudnn", "include") for site in sites)
             if os.path.exists(os.path.join(d, "cudnn.h"))][:1]
    return frontend + cudnn if frontend and cudnn else []


def sources(pattern):
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern), recursive=True))


def make_extension():
    cpp_sources = sources("csrc/**/*.cpp")
    cuda_sources = sources("csrc/**/*.cu")
    # -fopenmp: at::parallel_for is a header template whose `#pragma omp parallel` is compiled here;
    # without it the kernels run on one thread (and MKL then forks a team for every small GEMM).
    # No -mavx2 etc.: the binary stays portable; the vector kernels carry one copy per instruction set,
    # picked at run time (csrc/common/cpu_isa.h).
    cxx_flags = ["-O3", STD_FLAG, "-fvisibility-inlines-hidden", "-fopenmp"]
    # torch's headers as system headers: their warnings (ATen's vector headers compiled into every per-ISA copy:
    # "may be used uninitialized", "ignoring #pragma unroll") are theirs, and hid ours. GCC ignores the -I of a
    # directory also given with -isystem and searches it as a system one.
    from torch.utils.cpp_extension import include_paths

    for directory in include_paths():
        cxx_flags += ["-isystem", directory]
    common = dict(
        name="attn_ops._C",
        # Headers too: setuptools skips the whole build when no listed file is newer than the library,
        # and ninja then recompiles only the sources whose headers changed.
        depends=sources("csrc/**/*.h") + sources("csrc/**/*.cuh"),
        # -lstdc++ after our objects: the shared C++ runtime that libtorch uses, even where the compiler is set up
        # to link a static copy (attn_ops/_linkage.py says why that crashes; checked after the build).
        extra_link_args=["-fopenmp"] + (["-lstdc++"] if sys.platform.startswith("linux") else []),
        include_dirs=[os.path.join(ROOT, "csrc")],
        py_limited_api=False,
    )
    if want_cuda() and cuda_sources:
        # No GPU to detect on a build machine: default to the reference target (H100) unless told otherwise.
        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", ";".join(BUILD_CONFIG["cuda_architectures"]))
        common["include_dirs"] += cuda_library_includes()
        macros = [("ATTN_OPS_WITH_CUDA", "1")]
        cudnn_includes = cudnn_backend_includes()
        if cudnn_includes:
            common["include_dirs"] += cudnn_includes
            for directory in cudnn_includes:  # third-party headers, as torch's: their warnings are not ours
                cxx_flags += ["-isystem", directory]
            # cuDNN loaded at run time (the libcudnn torch loaded), the frontend's JSON support left out
            macros += [("ATTN_OPS_WITH_CUDNN", "1"), ("NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING", "1"),
                       ("CUDNN_FRONTEND_SKIP_JSON_LIB", "1")]
            common["extra_link_args"] = common["extra_link_args"] + ["-ldl"]
        else:
            print("attn_ops: no cudnn-frontend headers (pip install --no-deps nvidia-cudnn-frontend==1.32.0): "
                  "building without the cuDNN attention backend")
        return CUDAExtension(
            sources=cpp_sources + cuda_sources,
            define_macros=macros,
            extra_compile_args={
                "cxx": cxx_flags,
                "nvcc": [STD_FLAG] + BUILD_CONFIG["nvcc_flags"],
            },
            **common,
        )
    return CppExtension(sources=cpp_sources, extra_compile_args={"cxx": cxx_flags}, **common)


def load_linkage_checks():
    """attn_ops/_linkage.py, loaded by path: the package itself cannot be imported before it is built."""
    spec = importlib.util.spec_from_file_location("attn_ops_linkage", os.path.join(ROOT, "attn_ops", "_linkage.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildAndCheckExtension(BuildExtension.with_options(use_ninja=True)):
    """The build, then a check that the library links torch's shared libstdc++ (a clear build error instead of
    a segfault at the first call)."""

    def build_extension(self, ext):
        super().build_extension(ext)
        import torch

        torch_c10 = os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so")
        problem = load_linkage_checks().static_libstdcxx_problem(self.get_ext_fullpath(ext.name), torch_c10)
        if problem:
            raise RuntimeError(problem)


setup(
    name="attn_ops",
    version="0.1.0",
    description="MQA / GQA / MLA attention and KV-cache operators for PyTorch (CPU and CUDA)",
    packages=find_packages(include=["attn_ops", "attn_ops.*"]),
    ext_modules=[make_extension()],
    cmdclass={"build_ext": BuildAndCheckExtension},
    python_requires=">=3.10",
    install_requires=["torch>=2.11"],
    # attn_ops.integrations.transformers (docs/transformers.md) is tested with this minor release.
    extras_require={"transformers": ["transformers>=5.17.0,<5.18"]},
)
