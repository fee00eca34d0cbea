#!/usr/bin/env bash
# Installs the Debian packages the build needs (idempotent; skips apt when everything is present).
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config clang libclang-rt-14-dev
      libfmt-dev nlohmann-json3-dev libcli11-dev libpcre2-dev libutf8proc-dev libcpp-httplib-dev
      libgtest-dev libgmock-dev libbenchmark-dev libomp-dev python3 tmux)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
