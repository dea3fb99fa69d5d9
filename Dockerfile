# genvi in a container. CPU by default:
#   docker build -t genvi .
#   docker run --rm genvi                       # runs `genvi run demo`
#   docker run --rm -v "$PWD/out:/genvi/out" genvi genvi run noisy_cone
# NVIDIA GPU (the pinned JAX's CUDA 12 plugin; the wheels bring their own CUDA
# libraries, so the base image stays the same; needs the NVIDIA Container Toolkit):
#   docker build --build-arg DEVICE=cuda -t genvi:cuda .
#   docker run --rm --gpus all genvi:cuda python -c "import jax; print(jax.devices())"
FROM python:3.11-slim

ARG DEVICE=cpu
ENV PYTHONDONTWRITEBYTECODE=1 PIP_DISABLE_PIP_VERSION_CHECK=1 MPLBACKEND=Agg

WORKDIR /genvi
COPY pyproject.toml README.md ./
COPY genvi ./genvi
COPY experiments ./experiments
COPY scripts ./scripts
# the same install steps as CI and tests/test_install.py; genvi's experiments too
RUN GENVI_DEVICE="$DEVICE" GENVI_EXPERIMENTS=1 sh scripts/install.sh

CMD ["genvi", "run", "demo"]
