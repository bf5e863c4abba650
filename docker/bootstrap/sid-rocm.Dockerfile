# Offline base for ROCm builds: Debian sid, whose hipcc (clang 21) knows gfx942 and gfx950.
# Its HIP runtime is 6.x (libamdhip64.so.6): the manifest of a wheel built here says so.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
ARG PYTHON_TAG
COPY bootstrap/python-layout.sh /usr/local/lib/polykernels/python-layout.sh
RUN sh /usr/local/lib/polykernels/python-layout.sh "${PYTHON_TAG}"
ENV HIPCC=/usr/bin/hipcc
