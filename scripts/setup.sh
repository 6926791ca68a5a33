#!/usr/bin/env bash
# Idempotent set-up on Debian 12/13 as root: the Debian MPI stack, then .venv with hpcadj editable.
# A second run takes a few seconds: it only checks what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

debs=(openmpi-bin python3-mpi4py python3-petsc4py python3-h5py-mpi hdf5-tools
      python3-venv python3-pip python3-setuptools python3-numpy python3-matplotlib python3-tqdm
      python3-pytest python3-pytest-xdist python3-hypothesis shellcheck
      python3-numcodecs python3-zfpy)   # snapshot codecs (lossless Blosc, lossy zfp): built against Debian's numpy
missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: missing Debian packages (${missing[*]}); run 'make setup' as root or install them" >&2
    exit 2
  fi
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Debian's petsc4py.pth adds /usr/lib/petsc/lib/python3/dist-packages to sys.path, and /usr/lib/petsc
# is an alternative only PETSc's -dev package (and its ~340 build dependencies) registers. Register it
# for the newest installed real-scalar PETSc whose petsc4py is there (found by glob), so a user's
# unchanged `import petsc4py; petsc4py.init(sys.argv)` works in the venv and in /usr/bin/python3.
# Same name and link as the -dev package's, at a lower priority: installing that package later wins.
if [ ! -d /usr/lib/petsc/lib/python3/dist-packages/petsc4py ]; then
  petsc_real=$(for d in /usr/lib/petscdir/petsc[0-9]*/*-real; do   # not petsc64-* (64-bit indices)
                 case "$d" in /usr/lib/petscdir/petsc64-*) continue ;; esac
                 [ -d "$d/lib/python3/dist-packages/petsc4py" ] && echo "$d"
               done | sort -V | tail -n 1)
  if [ -z "$petsc_real" ]; then
    echo "setup: no petsc4py under /usr/lib/petscdir/petsc*/*-real; 'import petsc4py' needs PETSC_DIR" >&2
  elif [ "$(id -u)" -ne 0 ]; then
    echo "setup: /usr/lib/petsc is missing, so 'import petsc4py' needs PETSC_DIR=$petsc_real;" \
         "run 'make setup' as root to register it (update-alternatives)" >&2
  elif [ -e /usr/lib/petsc ] && [ ! -L /usr/lib/petsc ]; then
    echo "setup: /usr/lib/petsc exists and is not Debian's alternative; left alone" >&2
  else
    update-alternatives --quiet --install /usr/lib/petsc petsc "$petsc_real" 10
    echo "setup: registered /usr/lib/petsc -> $petsc_real (update-alternatives 'petsc')"
  fi
fi

stamp=.venv/.hpcadj-setup
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  [ -x .venv/bin/python ] || /usr/bin/python3 -m venv --system-site-packages .venv
  # Keep Debian's numpy: petsc4py and h5py are built against it (docs/architecture.md, pitfalls).
  sysnumpy=$(/usr/bin/python3 -c 'import numpy; print(numpy.__version__)')
  echo "numpy==$sysnumpy" > .venv/constraints.txt
  .venv/bin/python -m pip install -q --disable-pip-version-check -c .venv/constraints.txt \
      --no-build-isolation -e '.[test]'
  touch "$stamp"
fi
.venv/bin/python -c 'import hpcadj.imports as s; s.check()' 
# numba compiles every model's kernels once into its on-disk cache (a fresh clone: 25-40 s on 2 cores;
# cached: a second or two), so no run compiles at its first step and no MPI ranks race to write one
# cache entry; two processes side by side, each a share of the models
.venv/bin/python scripts/warm_kernels.py 0 2 & first=$!
.venv/bin/python scripts/warm_kernels.py 1 2 & second=$!
{ wait "$first" && wait "$second"; } || echo "setup: compiling the kernels failed (the first run will say why)" >&2
