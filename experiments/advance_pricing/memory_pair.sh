#!/bin/sh
# Alternated wave 128^3 x 300 gradients on 2 ranks with --memory 2GiB: the tree at OLD_TREE (RAM
# slots as many as fit) then this one (slots whose first touch does not pay left out), ROUNDS times.
# Usage: memory_pair.sh OUTDIR PROFILE.json OLD_TREE [ROUNDS]
out=$1; prof=$2; old=$3; rounds=${4:-2}
new=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"
cd "$out" || exit 1  # python -m puts the working directory first on sys.path: not a source tree
for r in $(seq "$rounds"); do
  for tree in "$old" "$new"; do
    uptime >> "$out/load.txt"
    PYTHONPATH=$tree mpirun -n 2 -x PYTHONPATH python -m hpcadj run --model wave --grid 128x128x128 --steps 300 \
      --memory 2GiB --costs "$prof" --quiet --json > "$out/$(basename "$tree").$r.json"
  done
done
uptime >> "$out/load.txt"
