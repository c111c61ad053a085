#!/usr/bin/env bash
# runtime-packages.sh BINARY: the Debian packages that own the shared libraries BINARY loads (ldd, then dpkg -S),
# one per line, sorted. The Containerfile's runtime stage installs exactly these, so the image follows the build's
# dependencies without a hand-kept list (plus ca-certificates when it loads OpenSSL: https needs the CA store). Exit 1,
# naming the library, when one belongs to no package.
set -euo pipefail
binary="${1:?usage: runtime-packages.sh BINARY}"
[[ -x "$binary" ]] || { echo "runtime-packages: '$binary' is not an executable" >&2; exit 1; }

libraries=$(ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }')
{
# OpenSSL verifies https peers against the system CA store, a package of data that no library links
if grep -q '/libssl\.so' <<<"$libraries"; then echo ca-certificates; fi
for lib in $libraries; do
  # dpkg knows the path it installed, which may be the /usr/lib one behind the /lib symlink, or the link's target
  owner=$(dpkg -S "$lib" 2>/dev/null || dpkg -S "/usr$lib" 2>/dev/null || dpkg -S "$(readlink -f "$lib")" 2>/dev/null) ||
    { echo "runtime-packages: $lib (loaded by $binary) belongs to no Debian package" >&2; exit 1; }
  echo "${owner%%:*}"
done
} | sort -u
