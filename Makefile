# Quick start:  make demo   (set up and run the main demo)
#               make test   (set up and run the test suite)
PYTHON ?= python3

.PHONY: install demo test cpp-test bench

# The extension is built against the torch already installed (no build isolation), so the ABI matches.
install:
	$(PYTHON) -m pip install -q -r requirements-dev.txt
	@start=$$(date +%s); $(PYTHON) -m pip install -q --no-build-isolation -e . && \
	  echo "== extension built in $$(( $$(date +%s) - start )) s"

demo: install
	$(PYTHON) examples/demo.py

test: install
	$(PYTHON) -m pytest tests -q

# LibTorch build (CMake) and its GoogleTest suite; needs libgtest-dev (apt-get install libgtest-dev).
cpp-test: install
	.ci/cpp_tests.sh

bench: install
	$(PYTHON) benchmarks/bench_attention.py
