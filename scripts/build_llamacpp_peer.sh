#!/usr/bin/env bash
# `make peer-llamacpp`: build llama.cpp's own batched benchmark (llama-batched-bench) and its
# server (llama-server) with the system compiler into .peers/llamacpp/bin, from the llama.cpp
# source that the pinned llama-cpp-python sdist vendors (PyPI is the one source this machine
# reaches). A peer that `pask-agent bench --peer llamacpp` and `pask_agent.eval.llamacpp_bfcl`
# measure beside us; never a dependency of the package.
set -euo pipefail
VERSION="${LLAMACPP_PY_VERSION:-0.3.36}"
DEST="${1:-.peers/llamacpp}"
PY="${PY:-python3}"
command -v cmake >/dev/null || { echo "cmake is needed to build llama.cpp" >&2; exit 2; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$PY" -m pip download --no-deps --no-binary :all: -q -d "$work" "llama-cpp-python==$VERSION"
tar xzf "$work/llama_cpp_python-$VERSION.tar.gz" -C "$work"
src="$work/llama_cpp_python-$VERSION/vendor/llama.cpp"
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DGGML_NATIVE=ON -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON >"$work/configure.log" 2>&1 || { tail -40 "$work/configure.log" >&2; exit 1; }
# the compiler's warnings go to the log; its last lines are shown if the build fails
cmake --build "$work/build" --target llama-batched-bench llama-server -j "$(nproc)" >"$work/build.log" 2>&1 ||
    { tail -40 "$work/build.log" >&2; exit 1; }
mkdir -p "$DEST/bin"
for tool in llama-batched-bench llama-server; do
    cp "$work/build/bin/$tool" "$DEST/bin/$tool.tmp"
    mv "$DEST/bin/$tool.tmp" "$DEST/bin/$tool"
done
echo "llama-cpp-python==$VERSION (its vendored llama.cpp)" >"$DEST/SOURCE"
echo "built llama-batched-bench and llama-server in $DEST/bin from llama-cpp-python $VERSION"
