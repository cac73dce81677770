#!/usr/bin/env bash
# Fill .ab with other revisions' packages for dev/ab_trees.py (gpu_check `ab`, carry `.ab`): each REF is checked out
# in a temporary worktree and copied as deepgemm_NAME with its imports rewritten (dev/rename_package.sh).
# Usage: dev/prepare_ab.sh NAME=REF [NAME=REF ...]   e.g. dev/prepare_ab.sh main=main nohint=exp/candidates-nohint
# (.ab keeps packages from earlier runs: remove it first to carry only these),
# then AB_TREES="deepgemm_main deepgemm_nohint" bash dev/gpu_check.sh install ab
set -euo pipefail
[ $# -gt 0 ] || { sed -n 2,6p "$0"; exit 2; }
root=$(git rev-parse --show-toplevel)
for pair in "$@"; do
  name=${pair%%=*} ref=${pair#*=}
  [[ "$pair" == *=* && -n "$name" && -n "$ref" ]] || { echo "prepare_ab: '$pair' is not NAME=REF" >&2; exit 2; }
  tmp=$(mktemp -d)
  git -C "$root" worktree add -q --detach "$tmp/tree" "$ref"
  bash "$root/dev/rename_package.sh" "$tmp/tree" "$root/.ab" "deepgemm_$name"
  git -C "$root" worktree remove --force "$tmp/tree"
  rm -rf "$tmp"
  echo "prepare_ab: .ab/deepgemm_$name from $ref ($(git -C "$root" rev-parse --short "$ref"))"
done
