#!/usr/bin/env bash
# Installs every Debian package the C++ build, tests and fuzzers need (chromium and its driver: the chat page's
# browser test; boost: the HTTP layer; OpenSSL and the CA store: https media URLs; image/audio codecs and FFTW: media
# input; nginx and prometheus: the deployment tests; ccache: builds in several checkouts share objects; ZeroMQ and msgpack: KV events). Idempotent.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git ccache
  nlohmann-json3-dev libcli11-dev libfmt-dev libsleef-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-14-dev
  python3 python3-venv python3-pip
  chromium chromium-driver
  libboost-dev libssl-dev ca-certificates
  libpng-dev libjpeg62-turbo-dev libwebp-dev libgif-dev
  libsndfile1-dev libvorbis-dev libmpg123-dev libsoxr-dev libfftw3-dev
  nginx prometheus
  libzmq3-dev cppzmq-dev libmsgpack-cxx-dev
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} Debian packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo_cmd=""
[ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo_cmd apt-get update -qq
$sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
