"""Compressed levels (hpcadj.checkpoint.storage.compressed) and ``hpcadj run --compress``: lossless
gradients bitwise equal to uncompressed ones for every model and level mix under mpirun 1/2/3 ranks,
the lossy bound and its labels, overflow and corruption detected, bad specs refused."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from hpcadj.checkpoint.storage import codec as C
from hpcadj.checkpoint.storage.base import CorruptSnapshot
from hpcadj.checkpoint.compression import codec_memory_bytes, peak_bytes, pooled_capacity, size_curve
from hpcadj.checkpoint.storage.compressed import CompressedLevel, CompressionOverflow, PooledLevel, frame, unframe
from hpcadj.checkpoint.storage.factory import make_level
from hpcadj.snapshot import FieldLayout
from hpcadj.imports import h5py

from ..helpers import HPCADJ, hpcadj_each, hpcadj_in_process, mpirun, run

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
#: (model, mix, ranks): every mix of every model on 1, 2 or 3 ranks in turn; 0 is one rank in this
#: process, which all one-rank cases but those of ONE_RANK_MPIRUN use (no process start-up); the 2- and
#: 3-rank cases share one mpirun a rank count (multi_rank_runs)
ONE_RANK_MPIRUN = {("heat", "ram"), ("grayscott", "pfs")}
CASES = [(m, x, 0 if 1 + i % 3 == 1 and (m, x) not in ONE_RANK_MPIRUN else 1 + i % 3)
         for i, (m, x) in enumerate((m, x) for m in MODELS for x in MIXES)]
CASES += [("heat", "three", 2), ("heat", "three", 3), ("wave", "pfs", 3)]


def run_json(ranks, args, tmp_path, timeout=240):
    """``hpcadj run args --json`` on ``ranks`` ranks under mpirun; with ``ranks=0``, one rank in this
    process (``hpcadj.cli.main``: the same run without a process's start-up)."""
    extra = ["--pfs-file", str(tmp_path / "ckpt.h5")] if "--pfs" in args else []
    argv = ["run", *args, *extra, "--local-dir", str(tmp_path), "--json", "--quiet"]
    p = hpcadj_in_process(argv) if ranks == 0 else mpirun(ranks, [HPCADJ, *argv], timeout=timeout)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def _lossless_args(model, mix):
    return ["--model", model, *MODELS[model], *MIXES[mix], "--check-compression"]


@pytest.fixture(scope="module")
def multi_rank_runs(tmp_path_factory):
    """{(model, mix, ranks): run --json object} of CASES on 2 and 3 ranks: a rank count's cases one
    after another in one mpirun (hpcadj_each), each with its own files."""
    out = {}
    for ranks in (2, 3):
        cases = [(m, x) for m, x, r in CASES if r == ranks]
        commands = []
        for m, x in cases:
            tmp = tmp_path_factory.mktemp(f"{m}-{x}-{ranks}")
            extra = ["--pfs-file", str(tmp / "ckpt.h5")] if "--pfs" in MIXES[x] else []
            commands.append(["run", *_lossless_args(m, x), *extra, "--local-dir", str(tmp), "--json", "--quiet"])
        for case, proc in zip(cases, hpcadj_each(commands, ranks, timeout=600)):
            assert proc.returncode == 0, (case, proc.stderr[-3000:])
            out[(*case, ranks)] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


@pytest.mark.parametrize("model,mix,ranks", CASES)
def test_lossless_gradient_is_bitwise(model, mix, ranks, tmp_path, request):
    if ranks > 1:
        info = request.getfixturevalue("multi_rank_runs")[model, mix, ranks]
    else:
        info = run_json(ranks, _lossless_args(model, mix), tmp_path)
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
    p = hpcadj_in_process(["run", "--model", "heat", "--grid", "8x8x8", "--steps", "4", "--ram", "2",
                           "--compress", "lossy:1e-6", "--quiet"])
    assert p.returncode == 0 and "LOSSY" in p.stdout


@pytest.mark.parametrize("spec", ["lossy", "lossy:abc", "lossy:-1", "gzip", "lossless:snappy"])
def test_bad_spec_is_one_line_exit_2(spec):
    argv = ["run", "--model", "heat", "--grid", "8x8x8", "--steps", "3", "--ram", "2", "--compress", spec]
    # the real command under mpirun for one spec, this process for the rest
    p = mpirun(1, [HPCADJ, *argv], timeout=120) if spec == "lossy" else hpcadj_in_process(argv)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert len([ln for ln in p.stderr.splitlines() if ln.startswith("hpcadj")]) == 1, p.stderr


# -- the RAM byte pool and its capacity (PooledLevel, size_curve, pooled_capacity) ----------------------

def test_pool_holds_snapshots_at_their_own_sizes_and_refuses_past_its_bytes():
    codec = C.parse_codec("lossless")
    size = len(frame(C.encode_snapshot(smooth_snapshot(), codec)))
    lv = PooledLevel(codec, LAYOUT, capacity=5, pool_bytes=int(3.5 * size), margin=1.0)
    for step in range(3):
        lv.write(step, smooth_snapshot(step))
    with pytest.raises(CompressionOverflow, match="pool now plans 3 slots, 1 held"):
        lv.write(3, smooth_snapshot(3))
    # nothing of u_3 stored; every other held snapshot dropped until the room left holds half of
    # what the pool would at the largest size (one here): u_0 and u_2 kept, one slot free
    assert 3 not in lv and 1 not in lv and lv.used <= lv.pool_bytes and lv.summary()["overflows"] == 1
    assert lv.capacity == 3 and lv.dropped == [1]
    snap = smooth_snapshot(2)
    back = lv.read(2)
    assert all(back[k].tobytes() == snap[k].tobytes() for k in snap)
    lv.free(0)
    lv.write(3, smooth_snapshot(3))  # the freed bytes are reused
    lv.write(4, smooth_snapshot(4))
    assert lv.peak_bytes <= lv.pool_bytes and lv.slot_bytes == lv.pool_bytes // 3
    lv._arena.view((3, "u"))[300] ^= 0xFF
    with pytest.raises(CorruptSnapshot):
        lv.read(3)


def test_arena_reuses_gaps_and_packs_blobs_when_no_gap_fits():
    from hpcadj.checkpoint.storage.compressed import Arena

    arena = Arena(100)
    for key, n in (("a", 30), ("b", 30), ("c", 30)):
        arena.alloc(key, n)[:] = bytes([ord(key)]) * n
    arena.free("a")
    arena.free("c")
    assert arena.alloc("d", 20) is not None and arena.where["d"][0] == 0  # first fit, low end
    arena.view("d")[:] = b"d" * 20
    assert arena.alloc("e", 50) is not None and arena.compactions == 1  # 50 free, no gap of 50
    assert bytes(arena.view("b")) == b"b" * 30 and bytes(arena.view("d")) == b"d" * 20
    assert arena.alloc("f", 1) is None and arena.used == 100


def test_size_curve_is_a_running_maximum_extrapolated_up_to_the_cap():
    at = size_curve([(0, 10), (10, 100), (20, 50)], cap=400)
    assert at(5) == 55 and at(10) == 100 and at(20) == 100  # never below an earlier probed size
    at = size_curve([(0, 10), (10, 100)], cap=400)
    assert at(20) == 190 and at(100) == 400  # the last slope, capped at the raw frame


def test_peak_bytes_follows_stores_moves_and_frees():
    from hpcadj.checkpoint.schedules.actions import Free, Move, Store

    actions = [Store(0, 0), Store(5, 0), Move(5, 0, 1), Store(7, 0), Free(7, 0), Store(9, 0)]
    assert peak_bytes(actions, 0, lambda n: n + 1) == 1 + 10  # u_0 with u_9 (u_5 moved, u_7 freed)
    assert peak_bytes(actions, 1, lambda n: n + 1) == 6


def test_pooled_capacity_plans_more_slots_than_the_worst_size_and_its_plan_fits():
    from hpcadj.checkpoint.manager import LevelPlan
    from hpcadj.checkpoint.schedules import make_schedule

    n, pool = 200, 100_000
    info = {"sizes": [(0, 500), (100, 5000), (200, 10000)], "margin": 1.2}
    worst = int(pool // (10000 * 1.2))
    plans = [LevelPlan("ram", "ram", worst)]

    def planner(candidate):
        return make_schedule("revolve", n, [p.slots for p in candidate])

    slots = pooled_capacity(plans, 0, pool, info["sizes"], info["margin"], planner, "auto", n)
    at = size_curve(info["sizes"])
    assert slots > worst
    assert peak_bytes(planner([LevelPlan("ram", "ram", slots)]).actions(), 0, lambda s: at(s) * 1.2) <= pool
    assert peak_bytes(planner([LevelPlan("ram", "ram", slots + 1)]).actions(), 0, lambda s: at(s) * 1.2) > pool
    assert pooled_capacity(plans, 0, pool, info["sizes"], info["margin"], planner, "store-all", n) == worst  # searched plans only


def pool_run(ranks, codec, tmp_path, extra=(), env=None):
    p = mpirun(ranks, [HPCADJ, "run", "--model", "wave", "--grid", "16x16x16", "--steps", "40", "--ram", "100KiB",
                       "--compress", codec, *extra, "--check-compression", "--json", "--quiet"],
               timeout=240, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_ram_pool_plans_beyond_worst_case_slots_and_stays_within_its_bytes(ranks, tmp_path):
    info = pool_run(ranks, "lossless", tmp_path, extra=["--compress-probe", "40"])
    c = info["compression"]
    ram = c["ram"]
    worst = next(note for note in info["notes"] if "compressed RAM pool" in note)
    assert ram["slots"] > int(worst.rsplit("worst-case slots: ", 1)[1].rstrip(")"))
    assert ram["overflows"] == 0 and ram["peak_pool_bytes"] <= ram["pool_bytes"] == 100 * 1024
    assert c["gradient_rel_error"] == 0.0


def test_pool_overflow_re_plans_and_the_gradient_stays_bitwise(tmp_path):
    """A probe of u_0..u_4 only, with no margin, under-plans the pool for a wave whose detail grows
    faster than u_3..u_4's slope: the overflow is agreed on every rank, counted, re-planned around."""
    info = pool_run(2, "lossless", tmp_path, env={"HPCADJ_COMPRESS_MARGIN": "1"})
    c = info["compression"]
    assert c["ram"]["overflows"] >= 1 and c["gradient_rel_error"] == 0.0
    assert any("compressed" in f and "pool" in f for f in info["faults"])


# -- hpcadj plan --compress and --memory with compressed RAM slots ----------------------------------------

def plan_json(*args):
    """``hpcadj plan`` in this process (the real command's exit status is checked below)."""
    p = hpcadj_in_process(["plan", "--steps", "100", "--snapshot-bytes", "1000000", *args, "--json"])
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_plan_buys_slots_at_the_compressed_size():
    raw = plan_json("--ram", "10MiB")
    comp = plan_json("--ram", "10MiB", "--compress", "lossless", "--compressed-bytes", "400000")
    assert raw["levels"][0]["slots"] == 10
    assert comp["levels"][0]["slots"] == 10 * 2 ** 20 // (400000 * 1.15 + 64)  # as run: probed x margin
    assert comp["compression"]["codec"] == "lossless" and not comp["compression"]["lossy"]
    assert comp["forward_steps"] < raw["forward_steps"]
    mem_raw = plan_json("--memory", "100MiB", "--baseline", "0B")
    mem = plan_json("--memory", "100MiB", "--baseline", "0B", "--compress", "lossy:1e-5", "--compressed-bytes",
                    "100000")
    assert mem["memory"]["ram_slots_fit"] > 4 * mem_raw["memory"]["ram_slots_fit"]
    # the codec's buffers, as run counts them for a one-field snapshot on the RAM pool
    codec = codec_memory_bytes(1000000, 1000000, file_levels=False)
    assert codec >= 2 * 1000000
    assert mem["memory"]["working states"] == mem_raw["memory"]["working states"] + codec


@pytest.mark.parametrize("args,message", [
    (["--compress", "lossless"], "--compressed-bytes"),
    (["--compressed-bytes", "100"], "needs --compress"),
    (["--compress", "lossy:x", "--compressed-bytes", "100"], "lossy:TOL"),
])
def test_plan_compress_bad_input_is_one_line_exit_2(args, message):
    argv = ["plan", "--steps", "10", "--ram", "1MiB", "--snapshot-bytes", "1000", *args]
    p = run([HPCADJ, *argv], timeout=60) if args == ["--compress", "lossless"] else hpcadj_in_process(argv)
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("hpcadj")]
    assert p.returncode == 2 and len(errors) == 1 and message in errors[0] and "Traceback" not in p.stderr


def test_memory_budget_sizes_ram_slots_at_their_compressed_size():
    base = ["run", "--model", "wave", "--grid", "48x48x48", "--steps", "60", "--json", "--quiet"]
    comp = ["--compress", "lossy:1e-4", "--compress-probe", "60"]
    p = mpirun(2, [HPCADJ, *base, *comp, "--memory", "40MiB"], timeout=120)
    least = float(re.search(r"the least budget that would do is ([\d.]+) MiB", p.stderr).group(1))
    # about 9 raw snapshots (0.86 MiB per rank) beside the rest: the measured baseline moves by up to
    # ~6 MiB between runs, so a margin of a few snapshots was refused now and then
    budget = f"{least + 8:.1f}MiB"
    raw = json.loads(mpirun(2, [HPCADJ, *base, "--memory", budget], timeout=120).stdout.splitlines()[-1])
    info = json.loads(mpirun(2, [HPCADJ, *base, *comp, "--memory", budget], timeout=120).stdout.splitlines()[-1])
    m, ram = info["memory"], info["compression"]["ram"]
    assert info["levels"][0]["slots"] > 2 * raw["levels"][0]["slots"] >= 2
    assert ram["pool_bytes"] == m["ram slots"] <= m["budget"] - (m["peak"] - m["ram slots"])
    assert ram["peak_pool_bytes"] <= ram["pool_bytes"] and ram["overflows"] == 0
    assert m["peak"] <= m["budget"] and info["peak_rss_bytes"] <= m["budget"]


def test_calibrate_compress_reports_what_plan_takes(tmp_path):
    p = mpirun(2, [HPCADJ, "calibrate", "--model", "wave", "--grid", "16x16x16", "--steps", "12", "--repeats", "1",
                   "--local-dir", str(tmp_path), "--compress", "lossless", "--json"], timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    c = json.loads(p.stdout.strip().splitlines()[-1])["compression"]
    assert c["codec"] == "lossless" and c["encode_s"] > 0 and c["decode_s"] > 0
    assert [s for s, _ in c["sizes"]][:2] == [0, 1] and max(b for _, b in c["sizes"]) == c["probed_bytes"]
    plan = plan_json("--ram", "10MiB", "--compress", "lossless", "--compressed-bytes", str(c["probed_bytes"]))
    assert plan["compression"]["slot_bytes"] == min(int(c["probed_bytes"] * 1.15) + 64, 1000000)
