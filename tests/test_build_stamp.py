"""benchmarks/gpu/build_stamp.py: the hash that decides whether gpu_check.sh may use a library built ahead."""

import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def stamp_module():
    script = os.path.join(ROOT, "benchmarks", "gpu", "build_stamp.py")
    spec = importlib.util.spec_from_file_location("build_stamp", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write(root, rel, text):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def tree(tmp_path):
    write(tmp_path, "csrc/attention/kernel.cu", "// kernel")
    write(tmp_path, "csrc/common/check.h", "// check")
    write(tmp_path, "setup.py", "# setup")
    write(tmp_path, "build_config.json", "{}")
    write(tmp_path, "attn_ops/_linkage.py", "# linkage")
    write(tmp_path, "docs/readme.md", "docs")
    return tmp_path


def test_stamp_follows_every_build_input(stamp_module, tree):
    base = stamp_module.build_stamp("9.0a", str(tree))
    assert base == stamp_module.build_stamp("9.0a", str(tree))
    assert stamp_module.build_stamp("9.0", str(tree)) != base
    for rel in ["csrc/attention/kernel.cu", "csrc/common/check.h", "setup.py", "build_config.json",
                "attn_ops/_linkage.py"]:
        original = (tree / rel).read_text()
        (tree / rel).write_text(original + " ")
        assert stamp_module.build_stamp("9.0a", str(tree)) != base, rel
        (tree / rel).write_text(original)
    assert stamp_module.build_stamp("9.0a", str(tree)) == base
    write(tree, "csrc/new_file.cpp", "")  # a new source is an input too
    assert stamp_module.build_stamp("9.0a", str(tree)) != base


def test_stamp_follows_the_cudnn_frontend_headers(stamp_module, tree, monkeypatch):
    """A library built with the cuDNN backend's headers is not one built without them: the carried
    .cudnn_frontend/include (or $ATTN_OPS_CUDNN_FRONTEND_INCLUDE) and its version are inputs."""
    monkeypatch.delenv("ATTN_OPS_CUDNN_FRONTEND_INCLUDE", raising=False)
    without = stamp_module.build_stamp("9.0a", str(tree))
    write(tree, ".cudnn_frontend/include/cudnn_frontend_version.h", "#define CUDNN_FRONTEND_MINOR_VERSION 32")
    carried = stamp_module.build_stamp("9.0a", str(tree))
    assert carried != without
    # the same headers named by the variable instead (prebuild_device.sh's case): the same stamp
    (tree / ".cudnn_frontend").rename(tree / "headers")
    assert stamp_module.build_stamp("9.0a", str(tree)) == without
    monkeypatch.setenv("ATTN_OPS_CUDNN_FRONTEND_INCLUDE", str(tree / "headers" / "include"))
    assert stamp_module.build_stamp("9.0a", str(tree)) == carried
    write(tree, "headers/include/cudnn_frontend_version.h", "#define CUDNN_FRONTEND_MINOR_VERSION 33")
    assert stamp_module.build_stamp("9.0a", str(tree)) not in (without, carried)


def test_stamp_ignores_files_outside_the_build(stamp_module, tree):
    base = stamp_module.build_stamp("9.0a", str(tree))
    (tree / "docs/readme.md").write_text("changed")
    write(tree, "tests/test_new.py", "")
    write(tree, "csrc/__pycache__/x.pyc", "")
    assert stamp_module.build_stamp("9.0a", str(tree)) == base


def test_stamp_of_this_checkout_lists_its_sources(stamp_module):
    files = stamp_module.input_files()
    assert "setup.py" in files and "build_config.json" in files
    assert any(f.endswith(".cu") for f in files) and any(f.endswith(".cpp") for f in files)
    assert all(f.startswith(("csrc/", "setup.py", "build_config.json", "attn_ops/")) for f in files)
