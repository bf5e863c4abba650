# Offline base for ROCm builds: Debian sid plus the ROCm HIP stack from Debian experimental,
# pinned to the target's toolkit (TOOLKIT, e.g. 7.2): hipcc on its clang, the HIP runtime
# (libamdhip64.so.<major>) and the headers. sid alone carries an older hipcc and the HIP 6
# runtime (libamdhip64.so.6), which a ROCm 7 torch does not ship: the extension must link the
# runtime major the label names. EXPERIMENTAL_PACKAGES comes from targets.toml's bootstrap table.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
ARG PYTHON_TAG
ARG TOOLKIT
ARG EXPERIMENTAL_PACKAGES
COPY bootstrap/python-layout.sh /usr/local/lib/polykernels/python-layout.sh
RUN sh /usr/local/lib/polykernels/python-layout.sh "${PYTHON_TAG}"
COPY bootstrap/install-experimental.sh /usr/local/lib/polykernels/install-experimental.sh
RUN sh /usr/local/lib/polykernels/install-experimental.sh "${TOOLKIT}" ${EXPERIMENTAL_PACKAGES}
ENV HIPCC=/usr/bin/hipcc
