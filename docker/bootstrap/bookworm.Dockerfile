# Offline base for CPU builds: Debian bookworm from the distribution archive (mmdebstrap),
# laid out the way cibuildwheel expects a manylinux image to be.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
ARG PYTHON_TAG
COPY bootstrap/python-layout.sh /usr/local/lib/polykernels/python-layout.sh
RUN sh /usr/local/lib/polykernels/python-layout.sh "${PYTHON_TAG}"
