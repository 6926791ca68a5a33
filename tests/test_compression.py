"""Compressed levels (hpcadj.checkpoint.storage.compressed) and ``hpcadj run --compress``: lossless
gradients bitwise equal to uncompressed ones for every model and level mix under mpirun 1/2/3 ranks,
the lossy bound and its labels, overflow and corruption detected, bad specs refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hpcadj.checkpoint.storage import codec as C
from hpcadj.checkpoint.storage.base import CorruptSnapshot
from hpcadj.checkpoint.storage.compressed import CompressedLevel, CompressionOverflow, frame, unframe
from hpcadj.checkpoint.storage.factory import make_level
from hpcadj.snapshot import FieldLayout
from hpcadj.stack import h5py

from .helpers import HPCADJ, mpirun

LAYOUT = {"u": FieldLayout((24, 20, 16), (0, 0, 0), (24, 20, 16)), "v": FieldLayout((24, 20), (0, 0), (24, 20))}


def smooth_snapshot(seed=0):
    rng = np.random.default_rng(seed)
    z, y, x = np.meshgrid(*[np.linspace(0, 1, n) for n in (24, 20, 16)], indexing="ij")
    u = np.sin(3 * np.pi * x) * np.cos(2 * np.pi * y) + z + 1e-9 * rng.standard_normal(x.shape)
    return {"u": u, "v": np.cos(np.linspace(0, 3, 480)).reshape(24, 20)}


def level(kind, spec, slot_bytes, tmp_path):
    return make_level(kind, 3, LAYOUT, None, local_dir=str(tmp_path), async_io=False,
                      codec=C.parse_codec(spec), slot_bytes=slot_bytes)


@pytest.mark.parametrize("kind", ["ram", "local"])
@pytest.mark.parametrize("spec", ["lossless", "lossless:zstd", "lossless:zfp"])
def test_lossless_round_trip_is_bitwise(kind, spec, tmp_path):
    lv = level(kind, spec, 80_000, tmp_path)
    assert isinstance(lv, CompressedLevel)
    snap = smooth_snapshot()
    lv.write(0, snap)
    back = lv.read(0)
    assert all(back[k].tobytes() == snap[k].tobytes() for k in snap)
    assert lv.summary()["stored_bytes"] < lv.summary()["raw_bytes"]
    lv.free(0)
    lv.close()


def test_lossy_bound_holds_and_is_recorded(tmp_path):
    lv = level("ram", "lossy:1e-5", 40_000, tmp_path)
    snap = smooth_snapshot()
    lv.write(3, snap)
    back = lv.read(3)
    assert max(np.max(np.abs(back[k] - snap[k])) for k in snap) <= 1e-5
    assert 0 < lv.summary()["max_error"] <= 1e-5
    assert lv.summary()["raw_bytes"] / lv.summary()["stored_bytes"] > 4


def test_snapshot_larger_than_its_slot_is_refused(tmp_path):
    lv = level("ram", "lossless", 1000, tmp_path)
    with pytest.raises(CompressionOverflow, match="more than the planned slot of 1000 bytes"):
        lv.write(0, smooth_snapshot())
    assert 0 not in lv and lv.stats.writes == 0


def test_corrupt_stored_bytes_are_detected(tmp_path):
    lv = level("ram", "lossless", 80_000, tmp_path)
    lv.write(0, smooth_snapshot())
    stored = lv.inner._data[0]["z"]
    stored.flags.writeable = True
    stored[200] ^= 0xFF
    with pytest.raises(CorruptSnapshot):
        lv.read(0)


def test_frame_round_trip():
    enc = C.encode_snapshot(smooth_snapshot(), C.parse_codec("lossless"))
    data = frame(enc) + b"\0" * 100
    back = unframe(data)
    assert back.keys() == enc.keys() and all(back[k] == enc[k] for k in enc)


MODELS = {"heat": ["--grid", "12x12x12", "--steps", "10"], "wave": ["--grid", "12x12x12", "--steps", "10"],
          "burgers": ["--grid", "24x24", "--steps", "10"], "grayscott": ["--grid", "24x24", "--steps", "5"]}
MIXES = {"ram": ["--ram", "3", "--compress", "lossless"],
         "disk": ["--ram", "1", "--disk", "3", "--no-async", "--compress", "lossless",
                  "--compress-disk", "lossless:zstd"],
         "async": ["--ram", "1", "--disk", "4", "--compress", "lossless"],
         "pfs": ["--ram", "1", "--pfs", "4", "--no-async", "--compress", "lossless:zfp",
                 "--compress-pfs", "lossless"],
         "three": ["--ram", "1", "--disk", "2", "--pfs", "3", "--compress", "lossless:zfp"]}
CASES = [(m, x, 1 + i % 3) for i, (m, x) in enumerate((m, x) for m in MODELS for x in MIXES)]
CASES += [("heat", "three", 2), ("heat", "three", 3), ("wave", "pfs", 3)]


def run_json(ranks, args, tmp_path, timeout=240):
    extra = ["--pfs-file", str(tmp_path / "ckpt.h5")] if "--pfs" in args else []
    p = mpirun(ranks, [HPCADJ, "run", *args, *extra, "--local-dir", str(tmp_path), "--json", "--quiet"],
               timeout=timeout)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("model,mix,ranks", CASES)
def test_lossless_gradient_is_bitwise(model, mix, ranks, tmp_path):
    info = run_json(ranks, ["--model", model, *MODELS[model], *MIXES[mix], "--check-compression"], tmp_path)
    c = info["compression"]
    assert c["gradient_rel_error"] == 0.0  # every component's difference exactly zero
    assert c["reference_J"] == info["J"]
    assert not info["lossy"]
    assert sum(lv["writes"] for lv in info["levels"] if lv["name"] in c) > 0


def test_lossy_run_says_so_everywhere(tmp_path):
    grad = tmp_path / "g.h5"
    info = run_json(2, ["--model", "wave", *MODELS["wave"], "--ram", "3", "--compress", "lossy:1e-7",
                        "--check-compression", "--gradient-out", str(grad), "--log-dir", str(tmp_path / "log")],
                    tmp_path)
    c = info["compression"]
    assert info["lossy"] and c["ram"]["lossy"] and 0 <= c["ram"]["max_error"] <= 1e-7
    assert 0 < c["gradient_rel_error"] < 1e-3
    with h5py().File(grad) as f:
        assert bool(f.attrs["lossy"]) and "lossy:1e-07" in f.attrs["compression"]
    summary = json.loads((tmp_path / "log" / "summary.json").read_text())
    assert summary["result"]["lossy"] is True
    record = json.loads((tmp_path / "log" / "run.json").read_text())
    assert record["record"]["lossy"] is True and record["record"]["compression"] == {"ram": "lossy:1e-07"}
    p = mpirun(1, [HPCADJ, "run", "--model", "heat", "--grid", "8x8x8", "--steps", "4", "--ram", "2",
                   "--compress", "lossy:1e-6", "--quiet"])
    assert p.returncode == 0 and "LOSSY" in p.stdout


@pytest.mark.parametrize("spec", ["lossy", "lossy:abc", "lossy:-1", "gzip", "lossless:snappy"])
def test_bad_spec_is_one_line_exit_2(spec):
    p = mpirun(1, [HPCADJ, "run", "--model", "heat", "--grid", "8x8x8", "--steps", "3", "--ram", "2",
                   "--compress", spec], timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert len([ln for ln in p.stderr.splitlines() if ln.startswith("hpcadj")]) == 1, p.stderr
