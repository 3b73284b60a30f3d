#!/usr/bin/env bash
# Python dependencies of the end-to-end tests (tests/e2e). Called by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --disable-pip-version-check --quiet --root-user-action=ignore -r tests/e2e/requirements.txt
