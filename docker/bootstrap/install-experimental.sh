#!/bin/sh
# Installs packages from Debian experimental on a sid base (the same mirror as the base's own
# sources), then proves the HIP toolchain is the toolkit asked for: hipcc's HIP version starts
# with TOOLKIT, and the runtime library of that major is present. Usage: TOOLKIT PACKAGE...
set -eu
toolkit="$1"; shift
sed -n 's/^\(deb [^ ]*\) sid /\1 experimental /p' /etc/apt/sources.list > /etc/apt/sources.list.d/experimental.list
test -s /etc/apt/sources.list.d/experimental.list || { echo "no sid line in /etc/apt/sources.list" >&2; exit 1; }
apt-get -o Acquire::Check-Valid-Until=false update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends -t experimental "$@"
rm -rf /var/lib/apt/lists/*
hip=$(hipcc --version | sed -n 's/^HIP version: //p')
case "$hip" in
  "$toolkit".*) ;;
  *) echo "hipcc reports HIP $hip but targets.toml asks for toolkit $toolkit" >&2; exit 1 ;;
esac
major="${toolkit%%.*}"
runtime=$(ls /usr/lib/x86_64-linux-gnu/libamdhip64.so."$major" 2>/dev/null || true)
test -n "$runtime" || { echo "no libamdhip64.so.$major after installing $*" >&2; exit 1; }
# One name for the LLVM that hipcc drives (the newest installed), for tools that read its offload bundles.
for tool in llvm-objdump clang-offload-bundler llvm-readelf; do
  found=$(ls /usr/lib/llvm-*/bin/$tool 2>/dev/null | sort -V | tail -n 1)
  if [ -n "$found" ]; then ln -sf "$found" "/usr/local/bin/$tool"; fi
done
echo "HIP $hip, $(basename "$runtime"), $(hipcc --version | grep -m 1 'clang version')"
