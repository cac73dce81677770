#!/usr/bin/env bash
# Copy another tree's deepgemm package as NAME (imports rewritten), so dev/ab_trees.py can load both in one process.
# Usage: dev/rename_package.sh OLD_CHECKOUT DEST_DIR [NAME]   e.g. git worktree add /tmp/old 34e2317 first
set -euo pipefail
src=$1 dest=$2 name=${3:-deepgemm_old}
rm -rf "$dest/$name" && mkdir -p "$dest" && cp -r "$src/deepgemm" "$dest/$name"
find "$dest/$name" -name __pycache__ -prune -exec rm -rf {} +
find "$dest/$name" -name '*.py' -exec sed -i -E "s/^NAMESPACE = \"deepgemm\"/NAMESPACE = \"$name\"/; s/\bdeepgemm\./$name./g; s/^(\s*)import deepgemm\b/\1import $name/; s/^(\s*)from deepgemm import/\1from $name import/" {} +
