#!/bin/sh
# The compiler launcher of a pip install (CMAKE_CXX_COMPILER_LAUNCHER): pip hides the build's output
# unless -v, so each step is said on the terminal itself, one line, when there is one (not in CI).
# $1: the file counting the steps done, $2: the steps in all; then the compiler's command line.
count=$1 total=$2
shift 2
for a in "$@"; do case $a in *.cc) src=$a ;; esac; done
# Opening /dev/tty is tried in a subshell: with no terminal (CI, a device without one) a failed
# redirection of a special built-in would end this shell itself (POSIX), and the compile with it.
if [ -n "${src:-}" ] && (true > /dev/tty) 2>/dev/null; then
  case $src in
    */unity/* | unity/*) name="${src##*unity/} ($(grep -c '^#include' "$src" 2>/dev/null) files)" ;;  # lt_unity's
    *) name=${src##*/csrc/} ;;
  esac
  echo >> "$count"
  printf '\r  lazytriton: compiling the C++ core [%s/%s] %s\n' "$(wc -l < "$count" | tr -d ' ')" "$total" \
    "$name" > /dev/tty 2>/dev/null
fi
exec "$@"
