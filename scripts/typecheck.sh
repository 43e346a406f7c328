#!/usr/bin/env bash
# mypy --strict over the package as it installs: services/ and protocols/ are mapped into
# grpo_stream (see pyproject), so check a tree of links laid out that way.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
tree="$(mktemp -d)"
trap 'rm -rf "$tree"' EXIT
mkdir "$tree/grpo_stream"
for entry in "$root"/grpo_stream/*; do ln -s "$entry" "$tree/grpo_stream/$(basename "$entry")"; done
ln -s "$root/services" "$tree/grpo_stream/services"
ln -s "$root/protocols" "$tree/grpo_stream/protocols"
cd "$tree"
"${PYTHON:-python}" -m mypy --config-file "$root/pyproject.toml" --strict -p grpo_stream "$@"
