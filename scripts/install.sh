#!/usr/bin/env bash
# Installs libgpupool: the library with its soname links, the header, the pkg-config file and the
# gpupool-run wrapper.
#
#   DIR/lib/libgpupool.so.X.Y.Z     the library (soname libgpupool.so.X)
#   DIR/lib/libgpupool.so.X         -> libgpupool.so.X.Y.Z   (what linked programs load)
#   DIR/lib/libgpupool.so           -> libgpupool.so.X       (what -lgpupool finds)
#   DIR/lib/pkgconfig/gpupool.pc    from gpupool.pc.in
#   DIR/include/gpupool.h
#   DIR/bin/gpupool-run
#
# Then: PKG_CONFIG_PATH=DIR/lib/pkgconfig cc app.c $(pkg-config --cflags --libs gpupool) \
#           -Wl,--no-as-needed -lcudart
# Outside /usr the .pc file adds an rpath to DIR/lib, so programs run without LD_LIBRARY_PATH.
# Relative paths (--prefix, --libdir, DESTDIR) are taken from the directory it is run in.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: scripts/install.sh --prefix DIR [--no-build] [--profile release|debug] [--libdir DIR]

  --prefix DIR     where to install (required)
  --no-build       install what target/PROFILE holds; do not run cargo build
  --profile NAME   cargo profile to build and install (default: release)
  --libdir DIR     library directory (default: PREFIX/lib)

DESTDIR, when set, is prepended to every installed path (for staging a package); the .pc file
keeps the final paths.
USAGE
}

die() {
    echo "install.sh: $*" >&2
    exit 2
}

# The value after an option that takes one.
need() {
    [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value (see --help)"
}

prefix="" libdir="" build=1 profile=release
while [ $# -gt 0 ]; do
    case $1 in
        --prefix) need "$@"; prefix=$2; shift 2 ;;
        --prefix=*) prefix=${1#*=}; shift ;;
        --libdir) need "$@"; libdir=$2; shift 2 ;;
        --libdir=*) libdir=${1#*=}; shift ;;
        --no-build) build=0; shift ;;
        --profile) need "$@"; profile=$2; shift 2 ;;
        --profile=*) profile=${1#*=}; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "install.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
    esac
done
[ -n "$prefix" ] || { echo "install.sh: --prefix is required" >&2; usage >&2; exit 2; }
case $profile in release|debug) ;; *) die "--profile is release or debug" ;; esac

# Paths are checked and made absolute from the caller's directory, before anything is installed.
# The pkg-config file cannot quote a path and LD_PRELOAD (gpupool-run) splits at spaces and
# colons, so only plain characters are accepted.
absolute() {
    local what=$1 value=$2
    case $value in
        "~"*) die "$what $value: a literal ~ (the shell does not expand it after '='; write \$HOME)" ;;
    esac
    value=$(realpath -m -- "$value")
    # No comma either: the .pc file's -Wl,-rpath,DIR splits its argument at commas.
    [[ $value =~ ^[A-Za-z0-9._/+=@%-]+$ ]] ||
        die "$what '$value': use only letters, digits and . _ / + = @ % - (pkg-config, -Wl, and LD_PRELOAD cannot quote other characters)"
    printf '%s' "$value"
}
prefix=$(absolute --prefix "$prefix")
libdir=$(absolute --libdir "${libdir:-$prefix/lib}")
includedir=$prefix/include
bindir=$prefix/bin
destdir=""
if [ -n "${DESTDIR:-}" ]; then
    destdir=$(realpath -m -- "$DESTDIR")
fi

cd "$(dirname "$0")/.."
src=$PWD
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
major=${version%%.*}
[ -n "$version" ] || { echo "install.sh: no version in Cargo.toml" >&2; exit 1; }

if [ "$build" = 1 ]; then
    flag=()
    [ "$profile" = release ] && flag=(--release)
    cargo build --quiet -p gpupool --lib "${flag[@]}"
fi
target_dir=${CARGO_TARGET_DIR:-$src/target}
built=$target_dir/$profile/libgpupool.so
[ -f "$built" ] || { echo "install.sh: $built not found (build it, or drop --no-build)" >&2; exit 1; }

real=libgpupool.so.$version
soname=libgpupool.so.$major
install -d "$destdir$libdir/pkgconfig" "$destdir$includedir" "$destdir$bindir"
install -m 0755 "$built" "$destdir$libdir/$real"
ln -sfn "$real" "$destdir$libdir/$soname"
ln -sfn "$soname" "$destdir$libdir/libgpupool.so"
install -m 0644 include/gpupool.h "$destdir$includedir/gpupool.h"
# gpupool-run learns where the library went (it looks in ../lib otherwise; --libdir may differ).
run=$(<scripts/gpupool-run)
run=${run/installed_libdir=\"\"/installed_libdir=\"$libdir\"}
printf '%s\n' "$run" > "$destdir$bindir/gpupool-run"
chmod 0755 "$destdir$bindir/gpupool-run"

rpath='-Wl,-rpath,${libdir} '
case $libdir in /usr/lib|/usr/lib64|/usr/lib/*) rpath='' ;; esac
pc=""
while IFS= read -r line; do
    [[ $line == "#"* ]] && continue
    line=${line//@PREFIX@/$prefix}
    line=${line//@LIBDIR@/$libdir}
    line=${line//@INCLUDEDIR@/$includedir}
    line=${line//@VERSION@/$version}
    line=${line//@RPATH@/$rpath}
    pc+=$line$'\n'
done < gpupool.pc.in
printf '%s' "$pc" > "$destdir$libdir/pkgconfig/gpupool.pc"
chmod 0644 "$destdir$libdir/pkgconfig/gpupool.pc"

echo "installed libgpupool $version into $destdir$prefix:"
echo "  $libdir/$real (+ $soname, libgpupool.so)"
echo "  $includedir/gpupool.h, $libdir/pkgconfig/gpupool.pc, $bindir/gpupool-run"
echo "build:   PKG_CONFIG_PATH=$libdir/pkgconfig cc app.c \$(pkg-config --cflags --libs gpupool) -Wl,--no-as-needed -lcudart"
echo "preload: $bindir/gpupool-run --summary stderr -- ./app"
