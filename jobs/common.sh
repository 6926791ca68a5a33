# shellcheck shell=bash
# Shared by jobs/gradient.sbatch, jobs/sweep.sbatch and jobs/scaling.sbatch: sourced, never submitted.
#
# Why one helper: the three scripts must launch, forward stop signals, write markers and requeue in
# exactly the same way, and a fix must land in one place. Everything here is configured by
# environment variables (see jobs/README.md); nothing is site-specific.
#
# Markers (plain key=value files) in a run's folder, which is also its hpcadj --log-dir:
#   COMPLETE  written only after the run exited 0 and left summary.json and its JSON result;
#   STOPPED   the run was asked to stop (SIGUSR1/SIGTERM) or stopped itself with status 75; says why,
#             whether it can be resumed, and whether the job was requeued;
#   FAILED    anything else, with the exit status.
# history.log in the job folder is the append-only record of every attempt (start, stop, requeue, end).

# Exit status of `hpcadj run` when it stopped on request and can be resumed (EX_TEMPFAIL).
readonly HPCADJ_EX_STOPPED=75

_hpcadj_now() { date -u +%Y-%m-%dT%H:%M:%SZ; }
hpcadj_log() { printf '[hpcadj-job %s] %s\n' "$(_hpcadj_now)" "$*" >&2; }
hpcadj_die() { hpcadj_log "error: $*"; exit 2; }

# hpcadj_init KIND: read the configuration, check it, install the signal traps.
hpcadj_init() {
    HPCADJ_KIND=$1
    # A site's environment (module load ..., source venv/bin/activate) in one file, sourced here so
    # the three scripts need no editing. Module scripts often use unset variables: no -u meanwhile.
    if [[ -n ${HPCADJ_ENV:-} ]]; then
        [[ -r $HPCADJ_ENV ]] || hpcadj_die "HPCADJ_ENV=$HPCADJ_ENV is not a readable file"
        set +u
        # shellcheck source=/dev/null
        source "$HPCADJ_ENV"
        set -u
    fi
    HPCADJ=${HPCADJ:-hpcadj}
    HPCADJ_LAUNCHER=${HPCADJ_LAUNCHER:-mpirun}
    HPCADJ_REQUEUE=${HPCADJ_REQUEUE:-1}
    HPCADJ_MAX_REQUEUE=${HPCADJ_MAX_REQUEUE:-5}
    HPCADJ_RESUME=${HPCADJ_RESUME:-auto}
    # After an attempt that failed or was killed (a node lost, SIGKILL) a rerun in the same folder
    # continues from the durable state in its run directory, if it has one (1), or starts over (0).
    HPCADJ_RESUME_FAILED=${HPCADJ_RESUME_FAILED:-1}
    HPCADJ_NTASKS=${HPCADJ_NTASKS:-${SLURM_NTASKS:-1}}
    HPCADJ_ATTEMPT=${SLURM_RESTART_COUNT:-0}
    # The job's folder lives on the shared file system (next to where sbatch ran, by default): logs,
    # markers and the HDF5 checkpoint file must survive the node.
    HPCADJ_OUTPUT=${HPCADJ_OUTPUT:-${SLURM_SUBMIT_DIR:-$PWD}/hpcadj-jobs}
    # Node-local snapshots go to the site's per-job scratch when it has one.
    HPCADJ_SCRATCH=${HPCADJ_LOCAL_DIR:-${SLURM_TMPDIR:-${TMPDIR:-/tmp}}}
    # Parallel HDF5 on a shared file system: POSIX locks there are unreliable or absent.
    export HDF5_USE_FILE_LOCKING=${HDF5_USE_FILE_LOCKING:-FALSE}

    HPCADJ_STOP_SIGNAL=""
    HPCADJ_REQUEUED=0
    _hpcadj_child=""
    _hpcadj_forwarded=0
    _hpcadj_trapped=0
    _hpcadj_resume_support=""

    command -v "$HPCADJ" >/dev/null 2>&1 \
        || hpcadj_die "hpcadj command '$HPCADJ' not found: activate its environment or set HPCADJ=/path/to/hpcadj"
    case $HPCADJ_LAUNCHER in
        mpirun | srun | none) ;;
        *) hpcadj_die "HPCADJ_LAUNCHER must be mpirun, srun or none, not '$HPCADJ_LAUNCHER'" ;;
    esac
    [[ $HPCADJ_NTASKS =~ ^[1-9][0-9]*$ ]] || hpcadj_die "rank count '$HPCADJ_NTASKS' is not a positive integer"

    # SLURM sends the batch shell SIGUSR1 (#SBATCH --signal=B:USR1@T, or scancel --signal=USR1 --batch)
    # before the time limit, and SIGTERM on scancel or at the limit. Either way: ask the run to stop.
    trap '_hpcadj_on_signal USR1' USR1
    trap '_hpcadj_on_signal TERM' TERM
    trap '_hpcadj_on_signal INT' INT
}

# hpcadj_model_args GRID: HPCADJ_MODEL_ARGS=(--model ... [--grid GRID] [--steps ...]) for hpcadj run.
# HPCADJ_MODEL is a model's name or the user's own as path/to/file.py:Name (a relative path is taken
# from the submit directory and made absolute, so every rank and a requeued attempt find the file) or
# package.module:Name (found on PYTHONPATH, which sbatch exports). An empty GRID or HPCADJ_STEPS drops
# the flag, for a model that takes no --grid or has its own number of steps.
hpcadj_model_args() {
    local grid=$1 model=$HPCADJ_MODEL file
    if [[ $model == *:* ]]; then
        file=${model%:*}
        if [[ $file == *.py || $file == */* ]]; then
            [[ $file == /* ]] || file=${SLURM_SUBMIT_DIR:-$PWD}/$file
            [[ -r $file ]] || hpcadj_die "HPCADJ_MODEL=$HPCADJ_MODEL: no such file $file"
            model=$file:${model##*:}
        fi
    fi
    HPCADJ_MODEL_ARGS=(--model "$model")
    [[ -n $grid ]] && HPCADJ_MODEL_ARGS+=(--grid "$grid")
    [[ -n ${HPCADJ_STEPS:-} ]] && HPCADJ_MODEL_ARGS+=(--steps "$HPCADJ_STEPS")
    return 0
}

# The trap: remember the first stop request and forward it once to the running launcher as SIGUSR1.
# SIGUSR1, not SIGTERM: mpirun forwards SIGUSR1 to every rank untouched, while on SIGTERM it kills
# the ranks itself after a short grace period, before they could finish the step and save state.
_hpcadj_on_signal() {
    _hpcadj_trapped=1
    if ((HPCADJ_REQUEUED)); then
        return # our own `scontrol requeue` terminates this attempt: nothing left to stop
    fi
    if [[ -z $HPCADJ_STOP_SIGNAL ]]; then
        HPCADJ_STOP_SIGNAL=$1
        hpcadj_log "received SIG$1: asking the run to stop at the end of its current step"
    fi
    if [[ -n $_hpcadj_child ]] && ((!_hpcadj_forwarded)) && kill -0 "$_hpcadj_child" 2>/dev/null; then
        _hpcadj_forwarded=1
        kill -USR1 "$_hpcadj_child" 2>/dev/null || true
    fi
}

# Wait for the launcher; a trapped signal interrupts `wait`, so wait again until it has really exited.
_hpcadj_wait_child() {
    local rc last=""
    while :; do
        _hpcadj_trapped=0
        rc=0
        wait "$_hpcadj_child" || rc=$?
        # 127: the child had already been reaped while the trap ran; its status is the one before.
        if ((rc == 127)) && [[ -n $last ]]; then
            rc=$last
            break
        fi
        ((_hpcadj_trapped)) || break
        last=$rc
    done
    _hpcadj_child=""
    return "$rc"
}

# Whether this hpcadj has --run-dir/--resume (issue 8). HPCADJ_RESUME=yes|no overrides the check.
hpcadj_supports_resume() {
    if [[ -z $_hpcadj_resume_support ]]; then
        case $HPCADJ_RESUME in
            yes | 1) _hpcadj_resume_support=yes ;;
            no | 0) _hpcadj_resume_support=no ;;
            *)
                if "$HPCADJ" run --help 2>/dev/null | grep -q -- '--resume'; then
                    _hpcadj_resume_support=yes
                else
                    _hpcadj_resume_support=no
                fi
                ;;
        esac
    fi
    [[ $_hpcadj_resume_support == yes ]]
}

# hpcadj_launcher N: the launcher prefix for N ranks, in the array HPCADJ_LAUNCH.
hpcadj_launcher() {
    local n=$1 extra=()
    case $HPCADJ_LAUNCHER in
        mpirun)
            # Inside an allocation OpenMPI's mpirun reads the node list from SLURM (and starts its
            # daemons on other nodes with srun), so it needs no PMI support from SLURM.
            read -ra extra <<<"${HPCADJ_MPIRUN_ARGS:-}"
            HPCADJ_LAUNCH=(mpirun -n "$n" "${extra[@]}")
            ;;
        srun)
            # Direct launch: the MPI library must support the PMI plugin named here (srun --mpi=list).
            read -ra extra <<<"${HPCADJ_SRUN_ARGS:-}"
            HPCADJ_LAUNCH=(srun --ntasks="$n" --mpi="${HPCADJ_SRUN_MPI:-pmix}" --kill-on-bad-exit=1 "${extra[@]}")
            ;;
        none)
            ((n == 1)) || hpcadj_die "HPCADJ_LAUNCHER=none runs one rank; $n were asked for"
            HPCADJ_LAUNCH=()
            ;;
    esac
}

# _hpcadj_mark DIR NAME KEY=VALUE...: write a marker atomically (a half-written marker never exists).
_hpcadj_mark() {
    local dir=$1 name=$2
    shift 2
    {
        printf 'time=%s\n' "$(_hpcadj_now)"
        printf 'job_id=%s\nattempt=%s\nhost=%s\n' "${SLURM_JOB_ID:-none}" "$HPCADJ_ATTEMPT" "$(hostname -s)"
        printf '%s\n' "$@"
    } >"$dir/.$name.tmp"
    mv -f "$dir/.$name.tmp" "$dir/$name"
}

hpcadj_history() {
    printf '%s attempt=%s %s\n' "$(_hpcadj_now)" "$HPCADJ_ATTEMPT" "$*" >>"$HPCADJ_JOB_DIR/history.log"
}

# hpcadj_job_dir DIR: the job's folder; records this attempt's start.
hpcadj_job_dir() {
    HPCADJ_JOB_DIR=$1
    mkdir -p "$HPCADJ_JOB_DIR"
    hpcadj_history "start kind=$HPCADJ_KIND host=$(hostname -s) ranks=$HPCADJ_NTASKS" \
        "nodes=${SLURM_JOB_NUM_NODES:-1} launcher=$HPCADJ_LAUNCHER hpcadj=$(command -v "$HPCADJ")" \
        "scratch=$HPCADJ_SCRATCH"
    hpcadj_log "$HPCADJ_KIND job ${SLURM_JOB_ID:-(no SLURM job)}, attempt $HPCADJ_ATTEMPT: output in $HPCADJ_JOB_DIR"
}

# Files of an earlier attempt that did not resume are moved to DIR/attempt-K, so a log folder never
# mixes two runs.
_hpcadj_set_aside() {
    local dir=$1 k=0 f moved=()
    for f in "$dir"/run.json "$dir"/summary.json "$dir"/rank*.jsonl "$dir"/result.json "$dir"/result.json.part \
        "$dir"/state "$dir"/checkpoints.h5; do
        [[ -e $f ]] && moved+=("$f")
    done
    ((${#moved[@]})) || return 0
    while [[ -e $dir/attempt-$k ]]; do k=$((k + 1)); done
    mkdir -p "$dir/attempt-$k"
    mv "${moved[@]}" "$dir/attempt-$k/"
    hpcadj_log "$dir: files of an earlier attempt moved to attempt-$k/"
}

# hpcadj_unit DIR N HPCADJ-RUN-ARGS...: one `hpcadj run` on N ranks with DIR as its log folder.
# Returns 0 (COMPLETE written), 75 (STOPPED, resumable) or the failure status (FAILED or STOPPED).
hpcadj_unit() {
    local dir=$1 n=$2
    shift 2
    mkdir -p "$dir"
    if [[ -e $dir/COMPLETE ]]; then
        hpcadj_log "$dir: already complete, not run again"
        return 0
    fi
    if [[ -n $HPCADJ_STOP_SIGNAL ]]; then # a stop arrived between two runs: do not start another
        _hpcadj_mark "$dir" STOPPED "reason=SIG$HPCADJ_STOP_SIGNAL received before the run started" \
            "rc=none" "resumable=yes"
        return "$HPCADJ_EX_STOPPED"
    fi

    local state=() resuming=0
    if hpcadj_supports_resume; then
        state=(--run-dir "$dir/state")
        if [[ -e $dir/STOPPED ]] && grep -qx 'resumable=yes' "$dir/STOPPED"; then
            state+=(--resume)
            resuming=1
        elif [[ $HPCADJ_RESUME_FAILED == 1 && -s $dir/state/manifest.json ]] \
            && [[ -e $dir/FAILED || -e $dir/STOPPED ]]; then
            # The earlier attempt died (a node lost, ranks killed) or was stopped without saving: what
            # it made durable (the HDF5 level, adjoint-<m>.h5) is checksummed, and hpcadj --resume
            # continues from its newest valid point, on any rank count.
            state+=(--resume)
            resuming=1
            hpcadj_log "$dir: the earlier attempt did not finish cleanly; resuming from its run directory"
        fi
    fi
    ((resuming)) || _hpcadj_set_aside "$dir"
    rm -f "$dir/STOPPED" "$dir/FAILED"

    local args=("$@") a
    for a in "${args[@]}"; do # the HDF5 level's file sits in the run's folder on the shared FS
        if [[ $a == --pfs ]]; then
            args+=(--pfs-file "$dir/checkpoints.h5")
            break
        fi
    done
    local scratch
    scratch="$HPCADJ_SCRATCH/hpcadj-${SLURM_JOB_ID:-$$}/$(basename "$dir")"
    hpcadj_launcher "$n"
    local cmd=("${HPCADJ_LAUNCH[@]}" "$HPCADJ" run "${args[@]}" --log-dir "$dir" --local-dir "$scratch"
        --json --quiet "${state[@]}")
    hpcadj_log "run: ${cmd[*]}"
    hpcadj_history "run dir=$dir resume=$resuming cmd=${cmd[*]}"

    _hpcadj_forwarded=0
    "${cmd[@]}" >"$dir/result.json.part" &
    _hpcadj_child=$!
    local rc=0
    _hpcadj_wait_child || rc=$?

    if ((rc == 0)) && [[ -s $dir/result.json.part && -s $dir/summary.json ]]; then
        mv -f "$dir/result.json.part" "$dir/result.json"
        _hpcadj_mark "$dir" COMPLETE "rc=0" "resumed=$resuming"
        hpcadj_history "complete dir=$dir"
        rmdir "$scratch" "$(dirname "$scratch")" 2>/dev/null || true # only if hpcadj left them empty
        return 0
    fi
    if ((rc == HPCADJ_EX_STOPPED)) || [[ -n $HPCADJ_STOP_SIGNAL ]]; then
        local why="SIG${HPCADJ_STOP_SIGNAL} received" resumable=no
        [[ -n $HPCADJ_STOP_SIGNAL ]] || why="the run stopped itself (a signal sent to its ranks directly)"
        ((rc == HPCADJ_EX_STOPPED)) && resumable=yes
        _hpcadj_mark "$dir" STOPPED "reason=$why" "rc=$rc" "resumable=$resumable"
        hpcadj_history "stopped dir=$dir rc=$rc resumable=$resumable"
        hpcadj_log "$dir: stopped ($why), run exit status $rc, resumable=$resumable"
        ((rc == 0)) && rc=1 # exited 0 without its outputs
        return "$rc"
    fi
    local why="exit status $rc"
    ((rc == 0)) && why="exit status 0 but summary.json or the JSON result is missing" && rc=1
    _hpcadj_mark "$dir" FAILED "reason=$why" "rc=$rc"
    hpcadj_history "failed dir=$dir rc=$rc"
    hpcadj_log "$dir: failed ($why)"
    return "$rc"
}

# hpcadj_finish RC: end the job. 0: COMPLETE in the job folder. 75: STOPPED, then requeue so the
# next start resumes, when the stop was asked for with SIGUSR1 (to the batch shell or to the ranks);
# not after SIGTERM, nor with HPCADJ_REQUEUE=0, nor after HPCADJ_MAX_REQUEUE restarts.
# Anything else: FAILED (or STOPPED when a stop was requested) and that status. Never returns.
hpcadj_finish() {
    local rc=$1 dir=$HPCADJ_JOB_DIR
    if ((rc == 0)); then
        # A folder that is also a run's folder already has its COMPLETE; a series gets its own here,
        # replacing the STOPPED of an earlier attempt.
        rm -f "$dir/STOPPED" "$dir/FAILED"
        [[ -e $dir/COMPLETE ]] || _hpcadj_mark "$dir" COMPLETE "rc=0"
        hpcadj_history "job complete"
        hpcadj_log "complete: $dir"
        exit 0
    fi
    if ((rc == HPCADJ_EX_STOPPED)); then
        local requeue=no why=""
        if [[ -z ${SLURM_JOB_ID:-} ]]; then
            why="not a SLURM job"
        elif [[ $HPCADJ_STOP_SIGNAL == TERM || $HPCADJ_STOP_SIGNAL == INT ]]; then
            # SIGTERM reaches the batch shell when SLURM itself ends the job: scancel, the time limit
            # without an earlier USR1, preemption. A cancelled job must stay cancelled.
            why="SIG$HPCADJ_STOP_SIGNAL: SLURM is ending this job (scancel, time limit or preemption)"
        elif [[ $HPCADJ_REQUEUE != 1 ]]; then
            why="HPCADJ_REQUEUE=$HPCADJ_REQUEUE"
        elif ((HPCADJ_ATTEMPT >= HPCADJ_MAX_REQUEUE)); then
            why="already restarted $HPCADJ_ATTEMPT times (HPCADJ_MAX_REQUEUE=$HPCADJ_MAX_REQUEUE)"
        else
            requeue=yes
        fi
        _hpcadj_stopped_marker "requeue=$requeue" ${why:+"requeue_skipped=$why"}
        if [[ $requeue == yes ]]; then
            hpcadj_history "requeue"
            hpcadj_log "stopped and resumable: requeueing job $SLURM_JOB_ID"
            # The requeue terminates this batch step (SIGTERM to it): markers are written before.
            HPCADJ_REQUEUED=1
            if scontrol requeue "$SLURM_JOB_ID"; then
                exit 0
            fi
            HPCADJ_REQUEUED=0
            _hpcadj_stopped_marker "requeue=failed"
            hpcadj_history "requeue failed"
            hpcadj_log "scontrol requeue failed: resubmit this script to resume"
        else
            hpcadj_history "stopped, not requeued ($why)"
            hpcadj_log "stopped and resumable, not requeued ($why): resubmit to resume"
        fi
        exit "$HPCADJ_EX_STOPPED"
    fi
    if [[ -n $HPCADJ_STOP_SIGNAL ]]; then
        _hpcadj_stopped_marker "requeue=no" "requeue_skipped=the run cannot be resumed (exit status $rc)"
        hpcadj_history "stopped, not resumable, rc=$rc"
    else
        [[ -e $dir/FAILED ]] || _hpcadj_mark "$dir" FAILED "rc=$rc"
        hpcadj_history "job failed rc=$rc"
    fi
    exit "$rc"
}

# The job folder's STOPPED marker: the run's own (same folder) gets the extra lines appended.
_hpcadj_stopped_marker() {
    local dir=$HPCADJ_JOB_DIR
    if [[ -e $dir/STOPPED ]]; then
        printf '%s\n' "$@" >>"$dir/STOPPED"
    else
        _hpcadj_mark "$dir" STOPPED "reason=SIG${HPCADJ_STOP_SIGNAL:-?} received" "$@"
    fi
}

# hpcadj_budget_args: --ram/--disk/--pfs from HPCADJ_RAM, HPCADJ_DISK, HPCADJ_PFS (empty: omitted),
# into the array HPCADJ_BUDGET_ARGS.
hpcadj_budget_args() {
    HPCADJ_BUDGET_ARGS=()
    [[ -n ${HPCADJ_RAM:-} ]] && HPCADJ_BUDGET_ARGS+=(--ram "$HPCADJ_RAM")
    [[ -n ${HPCADJ_DISK:-} ]] && HPCADJ_BUDGET_ARGS+=(--disk "$HPCADJ_DISK")
    [[ -n ${HPCADJ_PFS:-} ]] && HPCADJ_BUDGET_ARGS+=(--pfs "$HPCADJ_PFS")
    return 0
}
