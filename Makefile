# Quick start:  make demo   (set up and run the main demo)
#               make test   (set up and run the test suite)
PYTHON ?= python3
# Scripts outside the repository root import the in-place build through PYTHONPATH.
RUN = PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(PYTHON)

.PHONY: install demo test cpp-test bench cudnn-frontend-carry

# nvidia-cudnn-frontend: the headers of the CUDA build's cuDNN attention backend, without their Python-only
# dependencies (--no-deps).
# The extension is built in place (attn_ops/_C*.so) against the torch already installed, so the ABI
# matches; tools/build.py prints one line per compiled file and keeps the compiler's output in
# build/build.log. build/ keeps ninja's objects: an unchanged tree builds in seconds and a changed kernel
# recompiles that file only (pip install -e would rebuild everything in a fresh temporary directory).
install:
	$(PYTHON) -m pip install -q -r requirements-dev.txt
	$(PYTHON) -m pip install -q --no-deps nvidia-cudnn-frontend==1.32.0
	$(PYTHON) tools/build.py

demo: install
	$(RUN) examples/demo.py

test: install
	$(PYTHON) -m pytest tests -q

# LibTorch build (CMake) and its GoogleTest suite; needs libgtest-dev (apt-get install libgtest-dev).
cpp-test: install
	.ci/cpp_tests.sh

bench: install
	$(RUN) benchmarks/bench_attention.py

# The cudnn-frontend headers as .cudnn_frontend/include, for the device tool's `carry` (its GPU machine is offline;
# benchmarks/gpu/gpu_check.sh builds the cuDNN backend with them).
cudnn-frontend-carry:
	$(PYTHON) -m pip install -q --no-deps nvidia-cudnn-frontend==1.32.0
	rm -rf .cudnn_frontend && mkdir -p .cudnn_frontend && cp -r "$$($(PYTHON) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/include" .cudnn_frontend/include
