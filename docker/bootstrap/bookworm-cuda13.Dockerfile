# Offline base for CUDA builds: bookworm plus NVIDIA's CUDA compiler from PyPI wheels.
# Every nvidia-* wheel is pinned to the toolkit's minor: an unpinned nvidia-nvvm arrives newer
# and ptxas then rejects its PTX ("Unsupported .version").
ARG BASE_IMAGE
FROM ${BASE_IMAGE} AS fetch
ARG CUDA_VERSION
# The CA bundle (TLS-intercepting networks) exists only in this download stage: the final
# image copies the downloaded wheels, never the bundle.
COPY ca-bundle.crt /tmp/ca-bundle.crt
RUN if [ -s /tmp/ca-bundle.crt ]; then export PIP_CERT=/tmp/ca-bundle.crt; fi; \
    python3 -m venv /tmp/fetch && /tmp/fetch/bin/pip download --no-deps --only-binary=:all: -d /wheels \
      "nvidia-cuda-nvcc==${CUDA_VERSION}.*" "nvidia-cuda-runtime==${CUDA_VERSION}.*" \
      "nvidia-cuda-crt==${CUDA_VERSION}.*" "nvidia-cuda-cccl==${CUDA_VERSION}.*" "nvidia-nvvm==${CUDA_VERSION}.*"

FROM ${BASE_IMAGE}
ARG PYTHON_TAG
ARG CUDA_VERSION
COPY bootstrap/python-layout.sh /usr/local/lib/polykernels/python-layout.sh
RUN sh /usr/local/lib/polykernels/python-layout.sh "${PYTHON_TAG}"
COPY --from=fetch /wheels /tmp/cuda-wheels
RUN python3 -m venv /opt/cuda-pip \
 && /opt/cuda-pip/bin/pip install --no-index --no-deps --no-cache-dir /tmp/cuda-wheels/*.whl \
 && rm -rf /tmp/cuda-wheels \
 && cuda_root=$(ls -d /opt/cuda-pip/lib/python3*/site-packages/nvidia/cu*) \
 && ln -sfn "$cuda_root" /usr/local/cuda \
 && ln -sf "libcudart.so.${CUDA_VERSION%%.*}" /usr/local/cuda/lib/libcudart.so
ENV CUDA_HOME=/usr/local/cuda PATH=/usr/local/cuda/bin:$PATH
