#!/usr/bin/env bash
# Build a large, real character corpus for charlm: the C code of the Linux kernel as one text file.
#
# Every C source and header (*.c, *.h) of the kernel tree in Debian's `linux-source` package is concatenated in
# sorted path order (byte order: LC_ALL=C) into OUT, optionally cut to its first MAX_MB MiB. OUT is written under a
# temporary name in its own folder and renamed into place, so it is never seen half-written. Prints its size and
# SHA-256, so that two builds can be compared.
#
#   bash scripts/build_kernel_corpus.sh OUT.txt [MAX_MB]
#   charlm train --data OUT.txt                      # or --set data.tokenizer=byte to model its bytes
#
# The kernel tarball is /usr/src/linux-source-*.tar.xz; where it is missing the script installs `linux-source`
# with apt-get, which needs root on Debian or Ubuntu. The extracted sources go to a temporary folder
# (${TMPDIR:-/tmp}) and are removed at the end; together with OUT they need a few GB of free disk.
set -euo pipefail
export LC_ALL=C

me=build_kernel_corpus.sh
usage="usage: bash scripts/$me OUT.txt [MAX_MB]"

die() { # die STATUS MESSAGE: one line on stderr, then exit
    echo "$me: $2" >&2
    exit "$1"
}

[ $# -ge 1 ] && [ $# -le 2 ] && [ -n "$1" ] || die 2 "$usage"
out=$1
max_mb=${2:-}
if [ -n "$max_mb" ]; then
    [[ $max_mb =~ ^[0-9]{1,9}$ ]] && ((10#$max_mb > 0)) ||
        die 2 "MAX_MB must be a whole number of MiB above 0, got '$max_mb' ($usage)"
    max_mb=$((10#$max_mb))
fi
out_dir=$(dirname -- "$out")
[ -d "$out_dir" ] || die 2 "the folder of OUT does not exist: $out_dir"
[ ! -d "$out" ] || die 2 "OUT is a folder, not a file: $out"

newest_tarball() { # the newest kernel version's tarball, or nothing
    compgen -G '/usr/src/linux-source-*.tar.xz' | sort -V | tail -n 1 || true
}

tarball=$(newest_tarball)
if [ -z "$tarball" ]; then
    command -v apt-get >/dev/null ||
        die 1 "no /usr/src/linux-source-*.tar.xz, and no apt-get to install Debian's linux-source package"
    [ "$(id -u)" = 0 ] ||
        die 1 "no /usr/src/linux-source-*.tar.xz: run as root to install it (apt-get install linux-source)"
    echo "$me: installing linux-source with apt-get ..." >&2
    apt_log=$(mktemp)
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq linux-source; } \
        >"$apt_log" 2>&1; then
        die 1 "apt-get could not install linux-source (its output: $apt_log)"
    fi
    rm -f -- "$apt_log"
    tarball=$(newest_tarball)
    [ -n "$tarball" ] || die 1 "linux-source is installed but /usr/src holds no linux-source-*.tar.xz"
fi

sources=""
partial=""
cleanup() {
    [ -z "$sources" ] || rm -rf -- "$sources"
    [ -z "$partial" ] || rm -f -- "$partial"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

sources=$(mktemp -d)
echo "$me: extracting the *.c and *.h files of $tarball ..." >&2
mkdir "$sources/tree"
tar -xJf "$tarball" -C "$sources/tree" --wildcards '*.c' '*.h' || die 1 "could not extract the sources of $tarball"

# The files in sorted path order, each with its size; then which of them fit in MAX_MB: whole files first, and of
# the first one that does not fit, only its beginning. Cutting this way, no reader is ever stopped mid-pipe.
(cd "$sources/tree" && find . -type f \( -name '*.c' -o -name '*.h' \) -printf '%s\t%P\0') |
    sort -z -t $'\t' -k 2 >"$sources/list"
budget=$((max_mb ? max_mb * 1024 * 1024 : -1)) # bytes still to take; -1: no cap
last="" last_bytes=0
: >"$sources/whole"
while IFS=$'\t' read -r -d '' size path; do
    if ((budget < 0 || size <= budget)); then
        printf '%s\0' "$path" >>"$sources/whole"
        ((budget < 0)) || budget=$((budget - size))
    else
        last=$path last_bytes=$budget
        break
    fi
done <"$sources/list"

partial=$(mktemp "$out_dir/.$(basename -- "$out").XXXXXX")
(
    cd "$sources/tree"
    xargs -0 -r cat -- <"$sources/whole"
    [ -z "$last" ] || head -c "$last_bytes" -- "$last"
) >"$partial" || die 1 "could not write $out (is the disk full?)"
[ -s "$partial" ] || die 1 "$tarball holds no *.c or *.h files"
chmod 644 -- "$partial"
mv -f -- "$partial" "$out"
partial=""

bytes=$(stat -c %s -- "$out")
sha=$(sha256sum -- "$out" | cut -d ' ' -f 1)
awk -v f="$out" -v b="$bytes" -v s="$sha" -v t="$(basename -- "$tarball")" \
    'BEGIN { printf "%s: %d bytes (%.1f MiB) of C from %s, sha256 %s\n", f, b, b / 1048576, t, s }'
