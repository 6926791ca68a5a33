"""``hpcadj calibrate``: measure a model's step costs and each level's I/O costs into a profile."""

from __future__ import annotations

import json
import os

from . import CliError, together
from ..models.base import SolverError
from .common import (add_model_arguments, build_model, check_can_create, check_usable_directory, int_in,
                     memory_baseline, solver_failure, world)
from .options import add_checkpoint_options, checkpointing


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("calibrate", help="measure step and level costs into a cost profile",
                              description="Measure, with the current ranks, the forward- and adjoint-step "
                                          "time of a model and each level's write/read cost per snapshot. "
                                          "Levels measured: ram and disk, plus pfs with --pfs-file.")
    add_model_arguments(p)
    p.add_argument("--out", default=None, metavar="PROFILE.json", help="write the profile here")
    p.add_argument("--repeats", type=int_in(1), default=3, help="measurements per quantity (median; default 3)")
    add_checkpoint_options(p, "calibrate", "--local-dir", "--pfs-file", "--no-async", "--memory", "--compress")
    p.add_argument("--json", action="store_true", help="print the profile as one JSON object")
    p.set_defaults(func=main)


def main(args) -> int:
    from ..adjoint.session import Checkpointing, ConfigError, GradientSession, measure_costs

    if args.repeats < 1:
        raise CliError(f"--repeats must be >= 1, got {args.repeats}")
    comm = world(args)
    with together():  # before measuring; a path may be unusable on some ranks only
        for path, flag in ((args.out, "--out"), (args.pfs_file, "--pfs-file")):
            if path:
                check_can_create(path, flag)
        if args.local_dir:
            check_usable_directory(args.local_dir, "--local-dir")
    baseline = memory_baseline(args, comm)  # as hpcadj run measures it
    model = build_model(args, comm)
    if model.n_steps is None:
        raise CliError("calibrate times fixed steps: drop --adaptive/--t-final and give --steps (a step costs "
                       "the same at any dt for the explicit models; --costs from it serves --adaptive runs)")
    options = checkpointing(args)
    try:
        codecs = options.codecs()
        if args.memory is not None:  # the run this profile is for must fit, or measuring is moot
            GradientSession(model, Checkpointing(memory=args.memory, memory_baseline=baseline)).plan()
        profile = measure_costs(model, options, repeats=args.repeats)
        codec = codec_costs(model, codecs, comm)
    except ConfigError as exc:  # an unusable --local-dir / --pfs-file
        raise CliError(str(exc)) from None
    except SolverError as exc:
        raise solver_failure(exc, "a smaller --dt may help") from None
    if comm.rank == 0:
        if args.out:
            save_profile(profile, args.out)
        if args.json:
            print(json.dumps({**profile.to_dict(), **({"compression": codec} if codec else {})}))
        else:
            slot = model.snapshot_bytes() / comm.size  # a RAM slot's bytes on one rank (mean)
            print(f"hpcadj calibrate: {model.name} {model.describe().get('grid', '')}, {comm.size} rank(s)")
            print(f"  forward step {profile.forward_s * 1e3:.3f} ms, adjoint step {profile.adjoint_s * 1e3:.3f} ms")
            adv = profile.advance
            if adv is not None:
                runs = ", ".join(f"{m}: {t / m * 1e3:.3f}" for m, t in adv.runs)
                print(f"  advance of m steps: {adv.fixed_s * 1e3:.3f} ms + m x {adv.step_s * 1e3:.3f} ms "
                      f"(T = {adv.depth}; measured ms per step at m = {runs})")
            if profile.data_s is not None:
                print(f"  a step reversed from its adjoint data: {profile.data_s * 1e3:.3f} ms (capture and "
                      f"stand-in)")
            for lv in profile.levels:
                print(f"  {lv.name:<4}: write {lv.write_s * 1e3:.3f} ms, read {lv.read_s * 1e3:.3f} ms per "
                      f"snapshot, async hides {lv.overlap:.0%} of a write"
                      + (f", first touch {lv.fill_s * 1e3:.3f} ms a slot "
                         f"({lv.fill_s / max(slot, 1) * 2 ** 30:.3f} s/GiB)" if lv.fill_s else ""))
            if codec:
                print(f"  codec {codec['codec']}: encode {codec['encode_s'] * 1e3:.3f} ms, decode "
                      f"{codec['decode_s'] * 1e3:.3f} ms per snapshot, slot {codec['slot_bytes']} B of "
                      f"{codec['raw_bytes']} raw ({codec['raw_bytes'] / codec['slot_bytes']:.2f}x)")
            if args.out:
                print(f"  profile written to {args.out}")
    return 0


def codec_costs(model, codecs: dict, comm) -> dict:
    """The --compress codec's seconds per snapshot, slot size and probed ``(step, bytes)`` sizes on
    the model's probed states (``probed_bytes`` is what ``hpcadj plan --compressed-bytes`` takes)."""
    from ..checkpoint.compression import probe

    if not codecs:
        return {}
    info = probe(model, model.default_controls(), {"ram": codecs["ram"]}, comm)["ram"]
    return {"codec": info.codec.spec, "encode_s": info.encode_s, "decode_s": info.decode_s,
            "slot_bytes": info.slot_bytes, "probed_bytes": info.probed_bytes, "raw_bytes": info.raw_bytes,
            "sizes": [list(point) for point in info.sizes]}


def save_profile(profile, path: str) -> None:
    """Write the profile under a temporary name and rename it, so no partial profile is left."""
    partial = f"{path}.partial"
    try:
        profile.save(partial)
        os.replace(partial, path)
    except OSError as exc:
        if os.path.exists(partial):
            os.unlink(partial)
        raise CliError(f"cannot write {path}: {exc.strerror or exc}") from None
