#!/usr/bin/env bash
# The bash completion `kvcachectl completion bash` prints, loaded into a real
# bash and asked to complete command lines (COMP_WORDS/COMP_CWORD as bash
# sets them for a Tab press).
# Usage: completion_test.sh KVCACHECTL_BINARY
set -euo pipefail
if (($# != 1)); then
  echo "usage: $0 KVCACHECTL_BINARY" >&2
  exit 2
fi
ctl=$(realpath "$1")
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# It loads, and registers a function for the binary's name.
registered=$(bash -c "source <('$ctl' completion bash) && complete -p kvcachectl") ||
  fail "the script does not load in bash"
[[ $registered == "complete -F _kvcachectl kvcachectl" ]] ||
  fail "complete -p kvcachectl says: $registered"
echo "ok: loads ($registered)"

# complete WORDS...: the candidates for the last word (empty: a new word).
complete_line() {
  bash -c '
    source <("$1" completion bash)
    shift
    COMP_WORDS=(kvcachectl "$@")
    COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
    COMP_LINE="${COMP_WORDS[*]}"
    COMP_POINT=${#COMP_LINE}
    COMPREPLY=()
    _kvcachectl kvcachectl "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD - 1]}"
    if ((${#COMPREPLY[@]} > 0)); then printf "%s\n" "${COMPREPLY[@]}" | sort | tr "\n" " "; fi
  ' _ "$ctl" "$@"
}
expect() {  # expect "CANDIDATES" WORDS...
  local want=$1
  shift
  local got
  got=$(complete_line "$@")
  [[ $got == "$want" ]] || fail "completing 'kvcachectl $*': got '$got', want '$want'"
  echo "ok: kvcachectl $* <TAB> -> $got"
}

expect "stats status " st
expect "checkpoint completion " c
expect "tiers top " t
expect "list " checkpoint l
expect "list now verify " checkpoint ""
expect "" checkpoint verify ""          # the sequence: nothing to offer
expect "--interval --iterations " top --i
expect "grpc " --data-path g
expect "grpc " status --data-path g     # global options follow the subcommand too
expect "--target " --tar
expect "bash zsh " completion ""
expect "prune " policy --mode p
# Words as bash splits them at COMP_WORDBREAKS (= and :).
expect "lookup " --target unix : ///x.sock --json loo  # option values are not subcommands
expect "lookup " --target = 127.0.0.1 : 50051 loo
expect "lookup " --target 127.0.0.1 : 50051 loo
expect "grpc " --data-path = g
expect "auto grpc shm " --data-path =
expect "--interval --iterations " --target = h : 1 top --i
expect "stats status " --data-path grpc st  # an option's value is not the subcommand
expect "" policy --weights 1 0        # still inside --weights' three values
# Every subcommand `kvcachectl --help` lists is offered.
subcommands=$("$ctl" --help | awk '/^Subcommands:/ {on = 1; next} on && NF {print $1}' | sort |
  tr '\n' ' ')
[[ -n $subcommands ]] || fail "kvcachectl --help lists no subcommands"
expect "$subcommands" ""
echo "PASS: bash completion"
