# Builder for the cpu toolchain: the base (a vendor image pinned by digest, or an offline
# base from docker/bootstrap) plus the build tools and the torch SDK the extension compiles against.
ARG BASE_IMAGE
FROM ${BASE_IMAGE} AS fetch
ARG PYTHON_TAG
COPY ca-bundle.crt /tmp/ca-bundle.crt
COPY wheelhouse/ /wheelhouse/
COPY builder/fetch-build-tools.sh /tmp/fetch-build-tools.sh
RUN sh /tmp/fetch-build-tools.sh "${PYTHON_TAG}"

FROM ${BASE_IMAGE}
ARG PYTHON_TAG
COPY --from=fetch /tool-wheels /tmp/tool-wheels
COPY --from=fetch /opt/torch-sdk /opt/torch-sdk
COPY builder/install-build-tools.sh /usr/local/lib/polykernels/install-build-tools.sh
RUN sh /usr/local/lib/polykernels/install-build-tools.sh "${PYTHON_TAG}"
ENV POLYKERNELS_TORCH_SDK=/opt/torch-sdk/torch POLYKERNELS_BACKEND=cpu
