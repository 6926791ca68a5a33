#!/bin/sh
# One alternated pair of wave 128^3 x 300 gradients on 2 ranks: the plan made with the costs file
# without its advance model (as before), then with it: PROFILE_DIR holds wave128_noadv.json (no
# "advance" entry) and wave128.json. Usage: pair.sh OUTDIR PROFILE_DIR BUDGET...
out=$1; prof=$2; shift 2
mkdir -p "$out"
for p in wave128_noadv wave128; do
  uptime >> "$out/load.txt"
  mpirun -n 2 hpcadj run --model wave --grid 128x128x128 --steps 300 "$@" --local-dir "$out" \
    --costs "$prof/$p.json" --quiet --json > "$out/$p.$(date +%H%M%S).json"
done
uptime >> "$out/load.txt"
