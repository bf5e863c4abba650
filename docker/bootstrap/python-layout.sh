#!/bin/sh
# /opt/python/<tag>-<tag> as a venv of the system python3, and the cp39 path cibuildwheel probes.
set -eu
tag="$1"
have="cp$(python3 -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')"
if [ "$have" != "$tag" ]; then
  echo "this base's python3 is $have but targets.toml asks for $tag: update [bootstrap.*].python" >&2
  exit 1
fi
mkdir -p /opt/python
python3 -m venv "/opt/python/${tag}-${tag}"
ln -sfn "/opt/python/${tag}-${tag}" /opt/python/cp39-cp39
