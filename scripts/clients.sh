#!/usr/bin/env bash
# Generates a Python client (openapi-python-client) and a TypeScript client (openapi-typescript +
# openapi-fetch, type-checked with `tsc --strict`) from the checked-in openapi/openapi.json, with
# pinned versions, failing on any generator warning, and runs one scenario per client against a
# running Loupe in keyed mode: scripts/clients/{python,typescript}/scenario.*.
# Usage: LOUPE_API_KEY=<tenant key> scripts/clients.sh BASE_URL
# The generated code goes to target/clients/ (not committed).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
base=${1:?usage: scripts/clients.sh BASE_URL}
: "${LOUPE_API_KEY:?set LOUPE_API_KEY to a tenant key}"
document="$root/openapi/openapi.json"
out="$root/target/clients"
rm -rf "$out/python" "$out/typescript-src"
mkdir -p "$out"

# Fails when a generator's output mentions a warning.
no_warnings() {
  if grep -qi 'warn' "$2"; then
    cat "$2" >&2
    echo "clients: $1 printed warnings" >&2
    exit 1
  fi
}

# Python: the generated package, used untouched by the scenario, from the document with the
# transcripts' JSON form alone (scripts/clients/python/json_form.py says why).
python=$("$root/scripts/pyenv.sh")
venv_bin=$(dirname "$python")
"$python" "$root/scripts/clients/python/json_form.py" "$document" "$out/python-openapi.json"
"$venv_bin/openapi-python-client" generate --path "$out/python-openapi.json" --output-path "$out/python" \
  --meta none --config "$root/scripts/clients/python/generator.yaml" >"$out/python-generate.log" 2>&1 \
  || { cat "$out/python-generate.log" >&2; exit 1; }
no_warnings openapi-python-client "$out/python-generate.log"
# `--meta none` writes the package's modules straight into the output folder.
mkdir -p "$out/python-path" && rm -rf "$out/python-path/loupe_client"
mv "$out/python" "$out/python-path/loupe_client"
PYTHONPATH="$out/python-path" "$python" "$root/scripts/clients/python/scenario.py" "$base" "$document"

# TypeScript: pinned tools from package-lock.json, the types generated, the scenario compiled with
# `tsc --strict` (no emit on error) and run.
ts="$out/typescript"
mkdir -p "$ts"
cp "$root"/scripts/clients/typescript/{package.json,package-lock.json,tsconfig.json,scenario.ts} "$ts/"
(cd "$ts" && npm ci --no-audit --no-fund --loglevel=error >"$out/npm.log" 2>&1) || { cat "$out/npm.log" >&2; exit 1; }
(cd "$ts" && npx --no-install openapi-typescript "$document" -o schema.d.ts >"$out/typescript-generate.log" 2>&1) \
  || { cat "$out/typescript-generate.log" >&2; exit 1; }
no_warnings openapi-typescript "$out/typescript-generate.log"
(cd "$ts" && rm -rf out && npx --no-install tsc -p tsconfig.json)
(cd "$ts" && node out/scenario.js "$base" "$document")
echo "clients: ok"
