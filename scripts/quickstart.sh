#!/bin/sh
# Sets everything up and runs the main job: for now, probe this machine.
set -eu
REPO=$(CDPATH='' cd -- "$(dirname -- "$0")/.." && pwd)
sh "$REPO/scripts/setup.sh"
exec edgectl probe
