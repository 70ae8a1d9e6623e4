#!/bin/sh
# Sets everything up, then runs the whole test suite against the installed edgectl.
# Extra arguments go to pytest (e.g. -m "not engine and not systemd" for the fast tier).
set -eu
REPO=$(CDPATH='' cd -- "$(dirname -- "$0")/.." && pwd)
sh "$REPO/scripts/setup.sh"
VENV=${EDGECTL_PREFIX:-/opt/edgectl}/venv
cd "$REPO"
exec "$VENV/bin/pytest" -p no:cacheprovider "$@"
