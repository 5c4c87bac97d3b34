#!/usr/bin/env bash
# Prints the Debian packages that hold the shared libraries the given programs
# load (ldd), one a line: what the image's runtime stage installs
# (deploy/Containerfile), so that its list never falls behind the build's.
# Fails when a library is not found or belongs to no package.
# Usage: runtime-packages.sh PROGRAM...
set -euo pipefail
(($# > 0)) || { echo "usage: $0 PROGRAM..." >&2; exit 2; }

libraries=$(ldd "$@" | awk '
  / => not found/ { print "MISSING " $1; next }
  / => \// { print $3 }
  /^\t\/[^ ]+ \(/ { print $1 }' | sort -u)
if grep -q '^MISSING ' <<<"$libraries"; then
  echo "runtime-packages: libraries not found: $(grep '^MISSING ' <<<"$libraries" | cut -d' ' -f2 | xargs)" >&2
  exit 1
fi

# dpkg knows a library by the path its package ships, with or without the /usr merge
# (/lib/x86_64-linux-gnu/libc.so.6 or /usr/lib/...): ask for both, in one call.
candidates=()
while read -r lib; do
  case $lib in
    /usr/*) candidates+=("$lib" "${lib#/usr}") ;;
    *) candidates+=("$lib" "/usr$lib") ;;
  esac
done <<<"$libraries"
owners=$(dpkg-query -S "${candidates[@]}" 2>/dev/null || true)  # "libfoo1:amd64: /path"

packages=()
while read -r lib; do
  line=$(awk -v a="$lib" -v b="${lib#/usr}" -v c="/usr$lib" '
    { path = $NF } path == a || path == b || path == c { print; exit }' <<<"$owners")
  [[ -n $line ]] || { echo "runtime-packages: no package ships $lib" >&2; exit 1; }
  packages+=("${line%%:*}")  # "libfoo1:amd64: /lib/..." -> libfoo1
done <<<"$libraries"
printf '%s\n' "${packages[@]}" | sort -u
