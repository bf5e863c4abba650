#!/bin/sh
# Download stage of every builder recipe (the CA bundle, if any, exists only in this stage):
# wheels of the build tools (hash-locked), and the torch SDK -- headers plus the libraries whose sonames the
# extension records -- unpacked from the torch wheel in /wheelhouse. Any Python tag of that
# wheel will do: nothing imports torch.
set -eu
python="/opt/python/$1-$1/bin/python"
if [ -s /tmp/ca-bundle.crt ]; then export PIP_CERT=/tmp/ca-bundle.crt; fi
# Every file is checked against build-tools.lock's sha256s (`nox -s lock` regenerates it).
"$python" -m pip download --disable-pip-version-check --require-hashes --only-binary=:all: -d /tool-wheels \
  -r /tmp/build-tools.lock
wheel=$(ls /wheelhouse/torch-*.whl | head -n 1)
mkdir -p /opt/torch-sdk
"$python" - "$wheel" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as whl:
    for name in whl.namelist():
        if name.startswith(("torch/include/", "torch/lib/libtorch.so", "torch/lib/libtorch_cpu.so",
                            "torch/lib/libc10.so")):
            whl.extract(name, "/opt/torch-sdk")
PY
echo "torch SDK from $(basename "$wheel")" > /opt/torch-sdk/SOURCE
