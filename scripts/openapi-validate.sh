#!/usr/bin/env bash
# Validates an OpenAPI document (default: openapi/openapi.json) with an independent OpenAPI 3.1
# validator, openapi-spec-validator (pinned in scripts/requirements.txt), which resolves every
# $ref. Run by the test suite (tests/api/openapi.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
python=$(scripts/pyenv.sh)
"$python" -m openapi_spec_validator --schema 3.1.0 "${1:-openapi/openapi.json}"
