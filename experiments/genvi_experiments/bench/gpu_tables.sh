#!/usr/bin/env bash
# The benchmark pages' GPU tables (docs/benchmarks/vae.md, air.md and frontier.md): the
# VAE step at both sizes and the AIR step, each pair of systems timed in one process on
# the GPU (JAX's CUDA plugin; Pyro on torch's CUDA), recorded as vae_step_784_gpu,
# vae_step_64_gpu and air_step_gpu; the discrete-latent VAEs' estimator tables
# (binary_vae_gpu, categorical_vae_gpu) and the categorical VAE's time to a target with
# gv.AUTO (categorical_vae_auto_gpu); all in the folder given (render them into the
# pages with `python -m genvi_experiments.bench.results` once the files are in
# experiments/genvi_experiments/bench/results/).
#
#   GENVI_BENCH_COMMIT=$(git rev-parse --short HEAD) experiments/genvi_experiments/bench/gpu_tables.sh OUT [TABLE...]
#
# TABLE: vae_784, air, vae_64, frontier, frontier_auto (default: all, in that order).
#
# Each bench runs under its own time limit, so one that fails or runs long still
# leaves the others' results; the log of each is written beside them.
set -u
out=${1:?usage: gpu_tables.sh RESULTS_FOLDER [TABLE...]}
shift
tables=${*:-vae_784 air vae_64 frontier frontier_auto}
mkdir -p "$out"
export GENVI_RESULTS_DIR="$out" PYTHONUNBUFFERED=1
# JAX and torch share the card: neither takes most of its memory up front
export XLA_PYTHON_CLIENT_PREALLOCATE=false
python=${PYTHON:-python3}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
"$python" -c "import jax, numpyro, pyro, torch; print('jax', jax.__version__, jax.devices(), \
'numpyro', numpyro.__version__, 'pyro', pyro.__version__, 'torch', torch.__version__, \
torch.cuda.is_available())" 2>&1 | tee -a "$out/gpu.txt"

run() {  # table name, time limit (s), then the bench's module and arguments
  case " $tables " in *" $1 "*) ;; *) return ;; esac
  local log="$out/$1.log" limit=$2; shift 2
  timeout "$limit" "$python" -m "genvi_experiments.bench.$@" --record 2>&1 | tee "$log"
  echo "exit ${PIPESTATUS[0]}" | tee -a "$log"
}
run vae_784 140 vae.step --batches 64 256 1024 4096 --rounds 40
run air 200 air.step --rounds 12 --estimators reinforce baseline enum mvd hybrid iwelbo_reinforce iwelbo_mvd
run vae_64 120 vae.step --pixels 64 --hidden 200 --batches 64 256 1024 4096 --rounds 40
run frontier 300 frontier.discrete_vae --samples 2000 --rounds 10
run frontier_auto 260 frontier.discrete_vae --latents categorical --time-to-target 40 --seeds 1 \
  --strategies REINFORCE "RLOO(2)" "SWOR(2)" SD AUTO
